/*
 * attnforge.h — C ABI of the attnforge dispatch core (src/capi.rs).
 *
 * Written by hand; a unit test in src/capi/tests.rs parses this file and
 * checks every function (name, parameter count), struct (field names and
 * types, in order) and constant against the Rust exports, and compiles it
 * with `cc` (sizes and offsets) when a C compiler is installed.
 *
 * The symbols live in the attnforge Rust library; a cdylib that exports them
 * comes with the JAX front end (a wrapper crate with crate-type = cdylib).
 *
 * Conventions
 *  - Functions return an int status: ATTNFORGE_OK (0) or an ATTNFORGE_ERR_*.
 *    attnforge_last_error() gives this thread's message for the last failure.
 *  - Strides are in elements, for (batch, seq, head); the head-dim stride is 1.
 *    Dense tensors: Q/O [batch, seqlen_q, heads_q, d], K/V [batch, seqlen_k,
 *    heads_kv, d], any strides that are multiples of 8 elements (on sm90a,
 *    where the forward reads through TMA, no stride 0 over a dimension longer
 *    than 1). THD (ragged): [total_tokens, heads, d] with int32 cu_seqlens_q/k
 *    of batch + 1 prefix sums (device pointers) and total_q/total_k set.
 *    Outputs (O, dQ, dK, dV) need an address per element: strides that make two
 *    elements of one output alias are ATTNFORGE_ERR_INVALID_ARGUMENT.
 *  - LSE is f32, natural log: dense [batch, heads_q, seqlen_q], THD
 *    [heads_q, total_q], contiguous (attnforge_fwd_context says which).
 *  - Text outputs are NUL-terminated and truncated to the buffer.
 *  - Policy from the environment: ATTNFORGE_BACKEND_FWD / ATTNFORGE_BACKEND_BWD
 *    (comma lists, preference order), ATTNFORGE_DEBUG=1 (log each decision once),
 *    ATTNFORGE_GENERATED_PATH=sm80 (the generated kernels on the sm80 instruction
 *    path on Hopper too; default: the planner's template).
 */
#ifndef ATTNFORGE_H
#define ATTNFORGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTNFORGE_ABI_VERSION 1

/* Status codes. */
#define ATTNFORGE_OK 0
#define ATTNFORGE_ERR_INVALID_ARGUMENT 1 /* bad pointer, enum, shape, stride, or version skew */
#define ATTNFORGE_ERR_NO_BACKEND 2       /* every backend (or every one the policy names) declines */
#define ATTNFORGE_ERR_FRONT_END 3        /* the chosen backend is executed by a front end, not here */
#define ATTNFORGE_ERR_BUILD 4            /* NVRTC or the kernel cache failed */
#define ATTNFORGE_ERR_CUDA 5             /* no driver, or a driver call failed */
#define ATTNFORGE_ERR_TRUNCATED 6        /* text output did not fit the buffer */
#define ATTNFORGE_ERR_PANIC 7            /* internal error (a bug: please report) */

/* attnforge_problem.dtype */
#define ATTNFORGE_DTYPE_F16 0
#define ATTNFORGE_DTYPE_BF16 1
#define ATTNFORGE_DTYPE_F32 2

/* attnforge_problem.layout */
#define ATTNFORGE_LAYOUT_DENSE 0
#define ATTNFORGE_LAYOUT_THD 1

/* attnforge_problem.mask */
#define ATTNFORGE_MASK_NONE 0
#define ATTNFORGE_MASK_CAUSAL_TOP_LEFT 1
#define ATTNFORGE_MASK_CAUSAL_BOTTOM_RIGHT 2
#define ATTNFORGE_MASK_WINDOW 3

/* attnforge_problem.flags (bits) */
#define ATTNFORGE_FLAG_ATTN_MASK 1      /* an arbitrary attn_mask / bias is part of the problem */
#define ATTNFORGE_FLAG_REQUIRES_GRAD 2  /* a backward will follow */
#define ATTNFORGE_FLAG_DETERMINISTIC 4  /* the backward must be bitwise repeatable */
#define ATTNFORGE_FLAG_EQUAL_SEQLENS 8  /* THD: seqlen_q == seqlen_k for every sequence */

/* attnforge_fwd_context.lse_layout */
#define ATTNFORGE_LSE_DENSE 0  /* lse_dims = {batch, heads_q, seqlen_q} */
#define ATTNFORGE_LSE_PACKED 1 /* lse_dims = {heads_q, total_q, 0} */
#define ATTNFORGE_LSE_PADDED 2 /* lse_dims = {batch, heads_q, max_seqlen_q} */

/* One attention call. Set size = sizeof(attnforge_problem). */
typedef struct attnforge_problem {
    uint32_t size;
    int32_t dtype;          /* ATTNFORGE_DTYPE_* */
    int32_t layout;         /* ATTNFORGE_LAYOUT_* */
    int32_t mask;           /* ATTNFORGE_MASK_* */
    uint32_t head_dim_qk;
    uint32_t head_dim_v;
    uint32_t batch;
    uint32_t heads_q;
    uint32_t heads_kv;      /* heads_q must be a multiple (GQA/MQA) */
    uint32_t seqlen_q;      /* dense: lengths; THD: maximum over the batch */
    uint32_t seqlen_k;
    uint32_t total_q;       /* THD: total tokens; dense: 0 */
    uint32_t total_k;
    int32_t window_left;    /* ATTNFORGE_MASK_WINDOW: -1 = unbounded; else -1 */
    int32_t window_right;
    float scale;            /* 0 = 1/sqrt(head_dim_qk) */
    float softcap;          /* 0 = off */
    float dropout_p;        /* 0 = off */
    uint32_t flags;         /* ATTNFORGE_FLAG_* */
    int32_t cc_major;       /* device compute capability; 0 = the current device */
    int32_t cc_minor;
    uint32_t reserved;      /* 0 */
    const int32_t* cu_seqlens_q; /* THD: device, batch + 1 entries; dense: NULL */
    const int32_t* cu_seqlens_k;
} attnforge_problem;

/* A device tensor: pointer and (batch, seq, head) strides in elements. */
typedef struct attnforge_tensor {
    void* ptr;
    int64_t stride_batch;
    int64_t stride_seq;
    int64_t stride_head;
} attnforge_tensor;

/* What the forward leaves for a backward. */
typedef struct attnforge_fwd_context {
    uint32_t size;
    int32_t lse_layout;     /* ATTNFORGE_LSE_* */
    uint32_t lse_dims[3];
    float scale;            /* the softmax scale in effect */
    char backend[32];       /* producing backend, NUL-terminated */
} attnforge_fwd_context;

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(attnforge_problem) == 104, "attnforge_problem layout");
_Static_assert(sizeof(attnforge_tensor) == 32, "attnforge_tensor layout");
_Static_assert(sizeof(attnforge_fwd_context) == 56, "attnforge_fwd_context layout");
#endif

/* ATTNFORGE_ABI_VERSION of the library. */
int attnforge_abi_version(void);

/* Static text for a status code. */
const char* attnforge_status_string(int status);

/* This thread's last error message into buf (may be NULL); returns its full
 * length in bytes, 0 when the last call succeeded. */
size_t attnforge_last_error(char* buf, size_t len);

/* Run the forward on the chosen backend, on stream (a CUstream; NULL = legacy
 * default stream). lse may be NULL when no backward follows (inference): the
 * generated forward then writes O only. ctx_out may be NULL. */
int attnforge_fwd(const attnforge_problem* problem,
                  const attnforge_tensor* q,
                  const attnforge_tensor* k,
                  const attnforge_tensor* v,
                  const attnforge_tensor* o,
                  float* lse,
                  void* stream,
                  attnforge_fwd_context* ctx_out);

/* Workspace bytes the backward of problem needs on the backend the dispatcher
 * chooses (0 = none), into *bytes_out. No GPU needed when cc_major is set. */
int attnforge_bwd_workspace_size(const attnforge_problem* problem, size_t* bytes_out);

/* Run the backward on the chosen backend, on stream. lse: the forward's f32
 * LSE in the layout above (what attnforge_fwd writes). Outputs dq (like q),
 * dk, dv (like k, v; GQA: summed over each group's query heads). workspace:
 * at least attnforge_bwd_workspace_size bytes, 16-byte aligned. */
int attnforge_bwd(const attnforge_problem* problem,
                  const attnforge_tensor* q,
                  const attnforge_tensor* k,
                  const attnforge_tensor* v,
                  const attnforge_tensor* o,
                  const attnforge_tensor* d_o,
                  const attnforge_tensor* dq,
                  const attnforge_tensor* dk,
                  const attnforge_tensor* dv,
                  const float* lse,
                  void* workspace,
                  size_t workspace_bytes,
                  void* stream);

/* The dispatcher's explanation (chosen fwd/bwd backends, every candidate with
 * its reason, the generated kernel's spec) into buf. No GPU needed when
 * cc_major is set. */
int attnforge_explain(const attnforge_problem* problem, char* buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* ATTNFORGE_H */
