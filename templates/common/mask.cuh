// ---- common/mask.cuh: which keys a query row sees ------------------------------
// MASK_KIND: 0 none, 1 causal top-left, 2 causal bottom-right, 3 sliding window
// (left, right around the bottom-right diagonal; -1 = unbounded).
// Row i sees keys j with key_lo(i) <= j <= key_hi(i), clipped to [0, seqlen_k).

struct RowWindow {
    int diag;        // seqlen_k - seqlen_q: row i's bottom-right diagonal key is i + diag
    int last_key;    // seqlen_k - 1
    int left, right;

    __device__ __forceinline__ RowWindow(int seqlen_q, int seqlen_k, int left_, int right_)
        : diag(seqlen_k - seqlen_q), last_key(seqlen_k - 1), left(left_), right(right_) {}

    __device__ __forceinline__ int key_lo(int i) const {
        if (MASK_KIND == 3 && left >= 0) return max(0, i + diag - left);
        return 0;
    }
    __device__ __forceinline__ int key_hi(int i) const {
        if (MASK_KIND == 1) return min(last_key, i);
        if (MASK_KIND == 2) return min(last_key, i + diag);
        if (MASK_KIND == 3 && right >= 0) return min(last_key, i + diag + right);
        return last_key;
    }
};
