// ---- common/mask.cuh: which keys a query row sees ------------------------------
// MASK_KIND: 0 none, 1 causal top-left, 2 causal bottom-right, 3 sliding window
// (left, right around the bottom-right diagonal; -1 = unbounded).
// Row i sees keys j with key_lo(i) <= j <= key_hi(i), clipped to [0, seqlen_k).

struct RowWindow {
    int seqlen_q, seqlen_k, left, right;

    __device__ __forceinline__ int key_lo(int i) const {
        if (MASK_KIND == 3 && left >= 0) return max(0, i + seqlen_k - seqlen_q - left);
        return 0;
    }
    __device__ __forceinline__ int key_hi(int i) const {
        int hi = seqlen_k - 1;
        if (MASK_KIND == 1) hi = min(hi, i);
        if (MASK_KIND == 2) hi = min(hi, i + seqlen_k - seqlen_q);
        if (MASK_KIND == 3 && right >= 0) hi = min(hi, i + seqlen_k - seqlen_q + right);
        return hi;
    }
};
