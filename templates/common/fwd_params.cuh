// ---- common/fwd_params.cuh: the forward kernels' parameter block ------------------
// Launch parameters; the layout matches `attnforge::launch::FwdParams` (repr C).
struct FwdParams {
    const elem_t* q; const elem_t* k; const elem_t* v; elem_t* o; float* lse;  // lse: null = not written
    const int* cu_seqlens_q; const int* cu_seqlens_k;    // THD only
    long long q_sb, q_ss, q_sh;                          // strides in elements
    long long k_sb, k_ss, k_sh;
    long long v_sb, v_ss, v_sh;
    long long o_sb, o_ss, o_sh;
    long long lse_sb, lse_sh;                            // lse[b*sb + h*sh + row]
    int batch, heads_q, heads_kv, gqa_ratio;
    int seqlen_q, seqlen_k;                              // dense: lengths; THD: maxima
    int window_left, window_right;
    float scale_log2;                                    // softmax scale * log2(e)
    float softcap_pre;                                   // scale / cap
    float softcap_post;                                  // cap * log2(e)
    int num_m_blocks;
    int tile_phases;                                     // causal one-tile order (common/order.cuh)
    int ragged_order;                                    // ragged one-tile order: longest keys first (order.cuh)
};
