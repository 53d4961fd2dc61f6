// W4/W3 -> fp16 dequantization of weight rows (the GEMM prefill's reused tile buffer).
// Layouts: docs/FORMATS.md. One thread per packed word: W4 reads one qweight word and writes
// 8 fp16 (one 16-byte store); W3 reads one qhigh word and its two qlow words and writes 32.
// fp16(q * scale): the product is exact in fp32, one rounding - bit-equal to app.quant.

// Pair (k, k+1) of a word as half2: the even k in the low half-word, the odd one in the high.
__device__ __forceinline__ half2_t dequant_pair(int even, int odd, int offset, float s) {
    return float2_to_half2((float)(even - offset) * s, (float)(odd - offset) * s);
}

// qweight [R, K/8] -> out [R, K] fp16; thread i = word i (k = 8j .. 8j+7 of its row).
extern "C" __global__ void dequant_w4_kernel(const unsigned* __restrict__ qweight,
                                             const half_t* __restrict__ scales,
                                             half_t* __restrict__ out, long long words, int words_per_row) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= words) return;
    const long long row = i / words_per_row;
    const int j = (int)(i - row * words_per_row);
    const unsigned w = qweight[i];
    const float s = h2f(scales[row * (words_per_row / 16) + j / 16]);
    unsigned v[4];
#pragma unroll
    for (int m = 0; m < 4; ++m)  // nibble m: k = 8j + 2m; nibble 4 + m: k = 8j + 2m + 1
        v[m] = dequant_pair((w >> (4 * m)) & 15, (w >> (16 + 4 * m)) & 15, 8, s);
    reinterpret_cast<uint4*>(out)[i] = make_uint4(v[0], v[1], v[2], v[3]);
}

// qlow [R, K/16], qhigh [R, K/32] -> out [R, K]; thread i = qhigh word i (k = 32j .. 32j+31).
extern "C" __global__ void dequant_w3_kernel(const unsigned* __restrict__ qlow,
                                             const unsigned* __restrict__ qhigh,
                                             const half_t* __restrict__ scales,
                                             half_t* __restrict__ out, long long words, int words_per_row) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= words) return;
    const long long row = i / words_per_row;
    const int j = (int)(i - row * words_per_row);
    const unsigned hw = qhigh[i];
    const unsigned low[2] = {qlow[2 * i], qlow[2 * i + 1]};
    const float s = h2f(scales[row * (words_per_row / 4) + j / 4]);
    unsigned v[16];
#pragma unroll
    for (int m = 0; m < 16; ++m) {  // pair k = 32j + 2m, +1
        const unsigned lw = low[m >> 3];
        const int f = 2 * (m & 7);
        const int even = ((lw >> f) & 3) | (((hw >> m) & 1) << 2);
        const int odd = ((lw >> (16 + f)) & 3) | (((hw >> (16 + m)) & 1) << 2);
        v[m] = dequant_pair(even, odd, 4, s);
    }
    uint4* dst = reinterpret_cast<uint4*>(out) + 4 * i;
#pragma unroll
    for (int q = 0; q < 4; ++q) dst[q] = make_uint4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}
