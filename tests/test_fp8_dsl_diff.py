"""benchmark/lab/fp8_dsl_diff.py: the opcode counting of PTX and SASS text and the report's
comparison (the cross-compiles themselves run in the xcompile tests)."""

from benchmark.lab import fp8_dsl_diff as F

PTX = """
.version 9.4
.target sm_90a
.visible .entry kernel_0(
    .param .u64 p0
)
{
    .reg .b32 %r<4>;
    // a comment
    mov.b32 %r1, 0;
    @%p1 bra $L__BB0_2;
    @!%p2 add.s32 %r2, %r1, 1;
    add.s32 %r3, %r2, 1;
    cvt.rn.satfinite.e4m3x2.f32 %rs1, %f1, %f2;
$L__BB0_2:
    ret;
}
"""

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 BRA `(.L_x_1) ;                                /* 0x0000000000008947 */
        /*0020*/                   F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R2, R3, R4, RZ ;
        /*0030*/               @P1 PRMT R5, R2, 0x5410, R6 ;
        /*0040*/                   PRMT R7, R2, 0x5410, R6 ;
"""


def test_ptx_opcodes_count_instructions_not_directives():
    ops = F.ptx_opcodes(PTX)
    assert ops == {"add.s32": 2, "bra": 1, "cvt.rn.satfinite.e4m3x2.f32": 1, "mov.b32": 1, "ret": 1}


def test_sass_opcodes_with_and_without_predicates():
    ops = F.opcode_counts(SASS, F.SASS_OP)
    assert ops == {"BRA": 1, "F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C": 1, "LDC": 1, "PRMT": 2}


def _row(ptx_ops, sass_ops, sha):
    return {"ptx_sha256": sha, "cubin_sha256": sha, "ptx_version": "9.4", "ptx_lines": 10, "ptx_ops": ptx_ops,
            "sass_ops": sass_ops, "registers": [{"reg": 168, "stack": 0, "shared": 1024, "local": 0}]}


def test_report_lists_what_differs_and_says_when_nothing_does():
    same = _row({"add.s32": 2}, {"PRMT": 10}, "a" * 64)
    other = _row({"add.s32": 3, "cvt.u32.u16": 4}, {"PRMT": 12}, "b" * 64)
    assert F.differences(same["ptx_ops"], other["ptx_ops"]) == [("add.s32", 2, 3), ("cvt.u32.u16", 0, 4)]
    res = {"command": "c", "reference": "4.8.1", "variants": ["128,0,0"],
           "versions": {"4.6.2": {"variants": {"128,0,0": other}}, "4.8.0": {"variants": {"128,0,0": same}},
                        "4.8.1": {"variants": {"128,0,0": same}}}}
    md = F.markdown(res)
    assert "| 4.6.2 | 128,0,0 | bbbbbbbbbbbb | bbbbbbbbbbbb | 9.4 | 10 | 12 | 168 / 0 / 0 | 2 / 1 (SASS +20.0%) |" in md
    assert "| 4.8.0 | 128,0,0 | aaaaaaaaaaaa | aaaaaaaaaaaa | 9.4 | 10 | 10 | 168 / 0 / 0 | 0 / 0 (SASS +0.0%) |" in md
    assert "| `cvt.u32.u16` | 0 | 4 |" in md and "identical counts" in md
