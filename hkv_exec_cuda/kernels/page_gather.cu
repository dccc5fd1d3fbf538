// Gather byte runs of a pool into one contiguous buffer, or scatter them back, in one launch each.
//
// Run r is `lengths[r]` bytes at `pool + pool_offsets[r]` and at `buffer + buffer_offsets[r]`.
// Grid: blockIdx.x walks the runs (grid-stride), blockIdx.y picks one of gridDim.y equal parts of a run,
// so a few long runs still spread over many blocks.  A run whose two addresses and length are multiples
// of 16 bytes is copied in 16-byte vectors, any other run byte by byte.  Runs must not overlap in the
// buffer (gather) or in the pool (scatter).  No #include, so NVRTC compiles the file as it is; loaded by
// hkv_exec_cuda/kernels.py (cupy.RawModule).

struct alignas(16) Vec16 {  // one 16-byte load and store (ld/st.global.v4)
    unsigned int x, y, z, w;
};

__device__ __forceinline__ void copy_part(unsigned char* dst, const unsigned char* src, long long bytes,
                                          long long part, long long parts) {
    const unsigned long long misaligned =
        (reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src) |
         static_cast<unsigned long long>(bytes)) & 15ULL;
    if (misaligned == 0) {
        const long long count = bytes >> 4;
        const long long lo = count * part / parts, hi = count * (part + 1) / parts;
        Vec16* d = reinterpret_cast<Vec16*>(dst);
        const Vec16* s = reinterpret_cast<const Vec16*>(src);
        for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) d[i] = s[i];
    } else {
        const long long lo = bytes * part / parts, hi = bytes * (part + 1) / parts;
        for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) dst[i] = src[i];
    }
}

extern "C" __global__ void gather_runs(const unsigned char* __restrict__ pool, unsigned char* __restrict__ buffer,
                                       const long long* __restrict__ pool_offsets,
                                       const long long* __restrict__ buffer_offsets,
                                       const long long* __restrict__ lengths, long long n_runs) {
    for (long long r = blockIdx.x; r < n_runs; r += gridDim.x) {
        copy_part(buffer + buffer_offsets[r], pool + pool_offsets[r], lengths[r], blockIdx.y, gridDim.y);
    }
}

extern "C" __global__ void scatter_runs(unsigned char* __restrict__ pool, const unsigned char* __restrict__ buffer,
                                        const long long* __restrict__ pool_offsets,
                                        const long long* __restrict__ buffer_offsets,
                                        const long long* __restrict__ lengths, long long n_runs) {
    for (long long r = blockIdx.x; r < n_runs; r += gridDim.x) {
        copy_part(pool + pool_offsets[r], buffer + buffer_offsets[r], lengths[r], blockIdx.y, gridDim.y);
    }
}
