"""/proc/cpuinfo texts of the kinds of CPU ffai's dtype rules tell apart, for the host and
precision tests. Captured from real machines (first processor, flags abridged to those around
the relevant ones)."""

EPYC_ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 ssse3 fma avx f16c avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vnni avx512_bitalg
bogomips\t: 4792.79

processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 ssse3 fma avx f16c avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vnni avx512_bitalg
"""
AVX2_ONLY = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz
flags\t\t: fpu vme de pse tsc msr pae sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c rdrand avx2 bmi2
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 avx512_fp16 amx_tile amx_int8
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm asimddp sha512 sve asimdfhm i8mm bf16
CPU implementer\t: 0x41
"""
SSE_ONLY = """processor\t: 0
model name\t: Old CPU
flags\t\t: fpu sse sse2 sse4_1 sse4_2
"""
