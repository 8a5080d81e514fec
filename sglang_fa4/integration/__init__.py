"""Everything that touches SGLang: the hook bodies and every SGLang private name."""
