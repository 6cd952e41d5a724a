//! GPU correctness suite for the generated forward kernels.
//!
//! Data-driven: one table of cases (spec, shapes, memory layout, window,
//! softcap) runs through the whole pipeline — spec → plan → render → NVRTC →
//! cache → load → launch on a stream — on fresh random inputs, with O and LSE
//! poisoned (0xFF bytes = NaN) before the launch, and is compared with the f64
//! reference in `attnforge::reference`. Every O element must be written and
//! finite, LSE must be -inf exactly where a row sees no key, and every element
//! outside the logical output (gaps in strided buffers) must stay poisoned.
//!
//! Needs a CUDA GPU; without one it prints a skip line and passes. Run it on the
//! H200 with `make gpu-test` (see docs/benchmarks/README.md).
//! `ATTNFORGE_GPU_CASES=a,b` runs only the cases whose spec contains `a` or `b`.

mod common;

use std::fmt::Write as _;

use attnforge::launch::{self, FwdArgs, FwdProblem, TensorArg};
use attnforge::reference::{attention_fwd, RefProblem};
use attnforge::{AttnSpec, DType, Layout};
use common::{dense, from_bits, normal, off, thd, to_bits, Buf, Case, Mem};
use cudarc::driver::sys;
use rand::{Rng, SeedableRng};

/// The table. Odd sizes on purpose: 1, 17, 127, 1000, 4097; sq != sk both ways;
/// GQA 1/4/8; ragged batches with empty and one-token sequences.
fn cases() -> Vec<Case> {
    let mut v = vec![
        dense("fwd.bf16.d128.none.dense.sm80", 2, 4, 4, 1000, 1000),
        dense("fwd.f16.d128.none.dense.sm80", 2, 4, 4, 1000, 1000),
        dense("fwd.bf16.d64.none.dense.sm80", 2, 4, 4, 127, 1000),
        dense("fwd.f16.d64.none.dense.sm80", 1, 8, 1, 1, 4097),
        dense("fwd.bf16.d128.causal-tl.dense.sm80", 2, 4, 4, 1000, 1000),
        dense("fwd.bf16.d128.causal-br.dense.sm80", 2, 4, 4, 1000, 1000),
        dense("fwd.bf16.d128.causal-br.dense.sm80", 1, 8, 2, 17, 1000),
        dense("fwd.f16.d64.causal-br.dense.sm80", 1, 4, 4, 1000, 127).mem(Mem::Bhsd),
        dense("fwd.f16.d64.causal-tl.dense.sm80", 1, 4, 4, 1000, 127),
        dense("fwd.bf16.d64.causal-br.dense.sm80", 1, 8, 8, 4097, 4097).mem(Mem::PackedQkv),
        dense("fwd.bf16.d128.window.dense.sm80", 2, 8, 2, 1000, 1000).window(100, 0),
        dense("fwd.f16.d128.window.dense.sm80", 1, 4, 4, 127, 1000).window(37, 64),
        dense("fwd.bf16.d64.window.dense.sm80", 1, 4, 4, 1000, 1000)
            .window(-1, 17)
            .mem(Mem::Bhsd),
        dense("fwd.bf16.d128.none.dense.softcap.sm80", 2, 4, 4, 1000, 1000).softcap(30.0),
        dense("fwd.f16.d64.causal-br.dense.softcap.sm80", 1, 4, 4, 127, 127).softcap(5.0),
        dense("fwd.bf16.d128.none.dense.sm90a", 2, 8, 1, 1000, 1000),
        dense("fwd.bf16.d128.causal-br.dense.sm90a", 1, 4, 4, 4097, 4097),
        // d128 causal at short keys (the short-keys plan: two consumers at
        // block_n 128, Q in registers): odd lengths, GQA, and bottom-right with
        // fewer and with more queries than keys (last key tiles that the
        // first warpgroup's rows see in part, or not at all).
        dense("fwd.bf16.d128.causal-tl.dense.sm90a", 2, 4, 2, 517, 517),
        dense("fwd.f16.d128.causal-br.dense.sm90a", 1, 4, 4, 300, 700).mem(Mem::Bhsd),
        dense("fwd.bf16.d128.causal-br.dense.sm90a", 1, 4, 4, 1000, 517),
        // Top-left causal at short odd keys (the short-keys plan: two consumers
        // at block_n 128, the causal diagonal inside each 128-key tile), GQA.
        dense("fwd.bf16.d64.causal-tl.dense.sm90a", 2, 4, 2, 517, 517),
        // d64 without a mask at short keys: the short-keys variant (the main
        // tiles with TMA stores of O, 192-row blocks over 700 rows), GQA.
        dense("fwd.bf16.d64.none.dense.sm90a", 2, 4, 2, 700, 700),
        // Even query blocks: the one-tile entry runs as clusters of two (K/V
        // multicast), also with three 64-column chunks split 2 + 1.
        dense("fwd.bf16.d256.none.dense.sm90a", 1, 2, 2, 1000, 700),
        dense("fwd.f16.d192v128.none.dense.sm90a", 1, 4, 2, 500, 517).mem(Mem::Bhsd),
        // The rest of the head-dim family (the head-dim group of the coverage matrix), odd sizes.
        dense("fwd.bf16.d32.causal-br.dense.sm80", 2, 4, 2, 300, 517),
        dense("fwd.f16.d96.none.dense.sm80", 1, 4, 4, 127, 1000).mem(Mem::Bhsd),
        dense("fwd.bf16.d160.window.dense.sm80", 1, 4, 1, 1000, 1000).window(64, 64),
        dense("fwd.f16.d192.causal-br.dense.softcap.sm80", 1, 2, 2, 517, 517).softcap(15.0),
        dense("fwd.bf16.d224.none.dense.sm80", 1, 2, 1, 17, 1000),
        dense("fwd.bf16.d256.causal-br.dense.sm80", 2, 2, 2, 1000, 1000),
        dense("fwd.f16.d256.none.dense.softcap.sm80", 1, 2, 2, 300, 300).softcap(20.0),
        dense("fwd.bf16.d192v128.causal-br.dense.sm80", 1, 4, 2, 200, 300),
        dense("fwd.bf16.d40.none.dense.sm80", 1, 4, 4, 127, 127),
        thd(
            "fwd.bf16.d256.causal-br.thd.sm80",
            2,
            2,
            &[(300, 300), (0, 3), (1, 1), (700, 129)],
        ),
        thd("fwd.f16.d96.window.thd.sm80", 4, 4, &[(257, 257), (1, 9)]).window(32, 0),
        thd(
            "fwd.bf16.d128.none.thd.sm80",
            4,
            4,
            &[(0, 0), (1, 1), (1000, 1000), (17, 300), (127, 0), (300, 17)],
        ),
        thd(
            "fwd.f16.d64.causal-br.thd.sm80",
            8,
            2,
            &[(17, 17), (0, 5), (1, 1000), (1000, 127), (255, 256)],
        ),
        thd(
            "fwd.bf16.d128.causal-tl.thd.sm80",
            4,
            4,
            &[(1000, 1000), (1, 1), (64, 200)],
        ),
        thd(
            "fwd.f16.d128.window.thd.softcap.sm80",
            4,
            1,
            &[(500, 700), (0, 0), (33, 33)],
        )
        .window(64, 8)
        .softcap(20.0),
        thd("fwd.bf16.d64.window.thd.sm90a", 4, 4, &[(1000, 1000), (1, 1)]).window(128, -1),
        // Many sequences of unequal lengths (empty, one token, block edges,
        // fewer keys than queries): the one-tile entry's blocks map onto the
        // tiles of every sequence, whatever order they take them in.
        thd(
            "fwd.bf16.d128.causal-br.thd.sm90a",
            4,
            2,
            &[
                (700, 700),
                (1, 1),
                (0, 5),
                (1200, 1200),
                (129, 129),
                (64, 64),
                (300, 65),
                (500, 900),
                (128, 128),
            ],
        ),
    ];
    v.push(dense("fwd.f16.d128.none.dense.softcap.sm90a", 1, 4, 4, 257, 513).softcap(50.0));
    // Scores that grow (shrink) along the keys by far more than one key
    // tile's spread: the running max is raised in most tiles (the sm90a
    // softmax raises its reference max only past a slack, see softmax.cuh).
    v.push(dense("fwd.bf16.d128.none.dense.sm90a", 1, 4, 2, 300, 2000).key_ramp(24.0));
    v.push(dense("fwd.f16.d256.causal-br.dense.sm90a", 1, 2, 2, 700, 1000).key_ramp(-0.9));
    v.push(thd("fwd.f16.d64.none.thd.sm90a", 4, 4, &[(200, 1500), (0, 7), (33, 900)]).key_ramp(16.0));
    // Sequences out of key-length order (the one-tile entry takes them longest
    // keys first, common/order.cuh), an empty one, queries without keys, and a
    // longest query sequence whose keys are not the longest.
    v.push(thd(
        "fwd.bf16.d256.causal-br.thd.sm90a",
        2,
        1,
        &[(130, 130), (0, 0), (900, 600), (257, 700), (64, 0), (1, 1)],
    ));
    // d128 ragged without a mask: three consumers (192-row blocks) at block_n
    // 80 since session 41; sequences around the block edges (191, 193, 384),
    // empty and one-token ones, more keys than queries, GQA.
    v.push(thd(
        "fwd.bf16.d128.none.thd.sm90a",
        4,
        2,
        &[
            (1500, 1500),
            (0, 4),
            (1, 1),
            (191, 191),
            (193, 700),
            (384, 384),
            (65, 1300),
        ],
    ));
    v.push(dense("fwd.bf16.d128.none.dense.sm80", 1, 4, 4, 129, 1000).key_ramp(24.0));
    // d64 causal ragged: the one-consumer short-keys tiles (three blocks per
    // SM) and the two-consumer mid-keys tiles on sequences of unequal
    // lengths, the longest keys in the mid-keys range (769..=1024), GQA.
    v.push(thd(
        "fwd.f16.d64.causal-br.thd.sm90a",
        4,
        2,
        &[(1000, 1000), (0, 3), (65, 65), (1, 1), (800, 500), (192, 192)],
    ));
    v
}

struct Outcome {
    /// Launched as clusters of two blocks (K/V multicast).
    pairs: bool,
    o_rel: f64,
    lse_max_abs: f64,
    problems: Vec<String>,
}

/// The f64 reference of one case, per sequence: (O, LSE).
type Refs = Vec<(Vec<f64>, Vec<f64>)>;

/// How a kernel with both sm90a entries is launched.
#[derive(Clone, Copy)]
enum Entry {
    /// The launcher's rule.
    Rule,
    /// `LoadedKernel::set_persistent_grid(cap)`: the walk on at most `cap`
    /// blocks, or `ONE_TILE`.
    Cap(u32),
    /// The one-tile entry with every block alone (no clusters of two).
    Alone,
    /// The one-tile entry with its causal blocks in this many phases
    /// (`LoadedKernel::set_tile_phases`; the rule's count otherwise).
    Phases(u32),
    /// The one-tile entry with a ragged batch's sequences in the order that
    /// is not the default (`LoadedKernel::set_ragged_order(!RAGGED_ORDER_DEFAULT)`:
    /// batch order while the default is longest keys first, or the reverse).
    OtherRaggedOrder,
    /// The walk on at most `cap` blocks with a ragged batch's sequences in the
    /// order that is not the default (the walk takes the default order, longest
    /// keys first, from its shared-memory table where its blocks have at most
    /// `plan::SM90A_WALK_ORDER_ROUNDS` rounds).
    WalkOtherRaggedOrder(u32),
}

/// Run one case on `kernel`; `entry` chooses the entry of a kernel with a
/// walk entry (`LoadedKernel::set_persistent_grid`, restored after the launch).
/// The inputs come from `case_seed`, so every kernel of a case sees the same
/// data and the f64 reference is computed once per case (`refs`).
fn run_case(
    c: &Case,
    kernel: &attnforge::CompiledKernel,
    entry: Entry,
    case_seed: u64,
    refs: &mut Option<Refs>,
) -> Outcome {
    let rng = &mut rand::rngs::StdRng::seed_from_u64(case_seed);
    let spec = kernel.spec;
    let dt = spec.dtype;
    let (dq, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let (hq, hkv) = (c.heads_q, c.heads_kv);
    let is_thd = spec.layout == Layout::Thd;
    let lens: Vec<(usize, usize)> = if is_thd {
        c.lens.clone()
    } else {
        vec![c.lens[0]; c.batch]
    };
    let (sq_max, sk_max) = (
        lens.iter().map(|l| l.0).max().unwrap_or(0),
        lens.iter().map(|l| l.1).max().unwrap_or(0),
    );
    let total_q: usize = lens.iter().map(|l| l.0).sum();
    let total_k: usize = lens.iter().map(|l| l.1).sum();
    let cu = |i: usize| -> Vec<i32> {
        let mut v = vec![0i32];
        for l in &lens {
            let x = if i == 0 { l.0 } else { l.1 };
            v.push(v.last().unwrap() + x as i32);
        }
        v
    };
    let (cu_q, cu_k) = (cu(0), cu(1));
    // Token offset of sequence b's first row (dense: 0 within its batch entry).
    let tok = |b: usize, which: usize| {
        if is_thd {
            (if which == 0 { cu_q[b] } else { cu_k[b] }) as usize
        } else {
            0
        }
    };
    let bidx = |b: usize| if is_thd { 0 } else { b };

    // Tensor arguments over base pointer 0; real pointers are added below.
    let (b, sq, sk) = (c.batch as i64, sq_max as i64, sk_max as i64);
    let (tq, tk, tv, to, qkv_len);
    match (is_thd, c.mem) {
        (true, _) => {
            tq = TensorArg::thd(0, hq as i64, dq as i64);
            tk = TensorArg::thd(0, hkv as i64, dq as i64);
            tv = TensorArg::thd(0, hkv as i64, dv as i64);
            to = TensorArg::thd(0, hq as i64, dv as i64);
            qkv_len = [
                total_q * hq * dq,
                total_k * hkv * dq,
                total_k * hkv * dv,
                total_q * hq * dv,
            ];
        }
        (false, Mem::Bshd) => {
            tq = TensorArg::bshd(0, sq, hq as i64, dq as i64);
            tk = TensorArg::bshd(0, sk, hkv as i64, dq as i64);
            tv = TensorArg::bshd(0, sk, hkv as i64, dv as i64);
            to = TensorArg::bshd(0, sq, hq as i64, dv as i64);
            qkv_len = [
                (b * sq) as usize * hq * dq,
                (b * sk) as usize * hkv * dq,
                (b * sk) as usize * hkv * dv,
                (b * sq) as usize * hq * dv,
            ];
        }
        (false, Mem::Bhsd) => {
            tq = TensorArg::bhsd(0, sq, hq as i64, dq as i64);
            tk = TensorArg::bhsd(0, sk, hkv as i64, dq as i64);
            tv = TensorArg::bhsd(0, sk, hkv as i64, dv as i64);
            to = TensorArg::bhsd(0, sq, hq as i64, dv as i64);
            qkv_len = [
                (b * sq) as usize * hq * dq,
                (b * sk) as usize * hkv * dq,
                (b * sk) as usize * hkv * dv,
                (b * sq) as usize * hq * dv,
            ];
        }
        (false, Mem::PackedQkv) => {
            assert!(sq == sk && hq == hkv && dq == dv, "packed qkv needs equal shapes");
            let h = hq as i64;
            let d = dq as i64;
            let packed = TensorArg {
                ptr: 0,
                stride_batch: sq * 3 * h * d,
                stride_seq: 3 * h * d,
                stride_head: d,
            };
            tq = packed;
            tk = TensorArg {
                ptr: (h * d * 2) as u64,
                ..packed
            };
            tv = TensorArg {
                ptr: (2 * h * d * 2) as u64,
                ..packed
            };
            // O also strided (gaps) to check that nothing outside it is written.
            to = TensorArg {
                ptr: 0,
                stride_batch: sq * 2 * h * d,
                stride_seq: 2 * h * d,
                stride_head: d,
            };
            let n = (b * sq * 3 * h * d) as usize;
            qkv_len = [n, 0, 0, (b * sq * 2 * h * d) as usize];
        }
        (false, Mem::Mixed) => panic!("{}: Mixed is a backward-suite layout", c.spec),
    }

    // Random inputs, rounded to the element type; the reference sees the rounded values.
    let mut fill = |n: usize| -> Vec<u16> { (0..n).map(|_| to_bits(normal(rng), dt)).collect() };
    let (hbuf_q, hbuf_k, hbuf_v) = if c.mem == Mem::PackedQkv && !is_thd {
        let all = fill(qkv_len[0]);
        (all, Vec::new(), Vec::new())
    } else {
        let (q, mut k) = (fill(qkv_len[0]), fill(qkv_len[1]));
        if c.key_ramp != 0.0 {
            assert!(c.mem == Mem::Bshd, "{}: key_ramp is for BSHD and THD cases", c.spec);
            // Row-major [.., key, head, d]: the key (dense) or token (THD) of an element.
            let (row, keys) = (hkv * dq, if is_thd { total_k } else { sk_max });
            for (i, x) in k.iter_mut().enumerate() {
                let key = if is_thd { i / row } else { (i / row) % sk_max };
                let f = 1.0 + c.key_ramp as f64 * key as f64 / keys.max(1) as f64;
                *x = to_bits(from_bits(*x, dt) * f, dt);
            }
        }
        (q, k, fill(qkv_len[2]))
    };
    let packed = c.mem == Mem::PackedQkv && !is_thd;
    let mut inputs: Vec<Buf> = Vec::new();
    let (pq, pk, pv) = if packed {
        inputs.push(Buf::upload(&hbuf_q));
        (inputs[0].ptr, inputs[0].ptr, inputs[0].ptr)
    } else {
        inputs.extend([Buf::upload(&hbuf_q), Buf::upload(&hbuf_k), Buf::upload(&hbuf_v)]);
        (inputs[0].ptr, inputs[1].ptr, inputs[2].ptr)
    };
    let host_k: &[u16] = if packed { &hbuf_q } else { &hbuf_k };
    let host_v: &[u16] = if packed { &hbuf_q } else { &hbuf_v };
    let o_buf = Buf::new(qkv_len[3] * 2);
    o_buf.poison();
    let lse_len = if is_thd { hq * total_q } else { c.batch * hq * sq_max };
    let lse_buf = Buf::new(lse_len * 4);
    lse_buf.poison();
    let cu_q_buf = Buf::upload(&cu_q);
    let cu_k_buf = Buf::upload(&cu_k);

    let with = |t: TensorArg, base: u64| TensorArg { ptr: base + t.ptr, ..t };
    let args = FwdArgs {
        q: with(tq, pq),
        k: with(tk, pk),
        v: with(tv, pv),
        o: with(to, o_buf.ptr),
        lse: Some(lse_buf.ptr),
        problem: FwdProblem {
            batch: c.batch as u32,
            heads_q: hq as u32,
            heads_kv: hkv as u32,
            seqlen_q: sq_max as u32,
            seqlen_k: sk_max as u32,
            cu_seqlens_q: is_thd.then_some(cu_q_buf.ptr),
            cu_seqlens_k: is_thd.then_some(cu_k_buf.ptr),
            total_q: total_q as u32,
            total_k: total_k as u32,
            scale: None,
            softcap: c.softcap,
            window: c.window,
        },
    };
    let loaded = launch::load(kernel).expect("load");
    match entry {
        Entry::Rule => {}
        Entry::Cap(cap) => loaded.set_persistent_grid(cap),
        Entry::Alone => {
            loaded.set_persistent_grid(launch::ONE_TILE);
            loaded.set_clusters(false);
        }
        Entry::Phases(n) => {
            loaded.set_persistent_grid(launch::ONE_TILE);
            loaded.set_tile_phases(n);
        }
        Entry::OtherRaggedOrder => {
            loaded.set_persistent_grid(launch::ONE_TILE);
            loaded.set_ragged_order(!launch::RAGGED_ORDER_DEFAULT);
        }
        Entry::WalkOtherRaggedOrder(cap) => {
            loaded.set_persistent_grid(cap);
            loaded.set_ragged_order(!launch::RAGGED_ORDER_DEFAULT);
        }
    }
    // Twice: with the LSE, then the same call without one (inference), which
    // must give O bitwise the same and leave the LSE buffer untouched.
    let no_lse = FwdArgs {
        lse: None,
        ..args.clone()
    };
    let run = |a: &FwdArgs| {
        // SAFETY: buffers sized for the shapes above, null stream.
        let launched = unsafe { launch::launch_fwd(&loaded, a, std::ptr::null_mut()) };
        if launched.is_err() {
            loaded.set_persistent_grid(0);
            loaded.set_clusters(true);
            loaded.set_tile_phases(0);
            loaded.set_ragged_order(launch::RAGGED_ORDER_DEFAULT);
        }
        launched.expect("launch");
        // SAFETY: synchronize the context after the launch; a kernel fault surfaces here.
        unsafe { sys::cuCtxSynchronize() }.result().expect("kernel execution");
    };
    let pairs = loaded.pairs(&args).expect("checked call");
    run(&args);
    let o_dev: Vec<u16> = o_buf.download(qkv_len[3]);
    let lse_dev: Vec<f32> = lse_buf.download(lse_len);
    o_buf.poison();
    lse_buf.poison();
    run(&no_lse);
    loaded.set_persistent_grid(0);
    loaded.set_clusters(true);
    loaded.set_tile_phases(0);
    loaded.set_ragged_order(launch::RAGGED_ORDER_DEFAULT);
    drop(inputs);
    let mut problems = Vec::new();
    let o_again: Vec<u16> = o_buf.download(qkv_len[3]);
    if o_again != o_dev {
        let n = o_again.iter().zip(&o_dev).filter(|(a, b)| a != b).count();
        problems.push(format!(
            "without an LSE, {n} elements of O differ from the call with one"
        ));
    }
    let lse_after: Vec<u32> = lse_buf.download(lse_len);
    if let Some(i) = lse_after.iter().position(|&x| x != u32::MAX) {
        problems.push(format!("without an LSE, LSE[{i}] was written"));
    }
    let mut written = vec![false; o_dev.len()];
    let (mut err2, mut ref2, mut lse_max_abs) = (0.0f64, 0.0f64, 0.0f64);
    let scale = 1.0 / (dq as f64).sqrt();
    let tq0 = TensorArg { ptr: 0, ..tq };
    let tk0 = TensorArg {
        ptr: if packed { (hq * dq) as u64 } else { 0 },
        ..tk
    };
    let tv0 = TensorArg {
        ptr: if packed { (2 * hq * dq) as u64 } else { 0 },
        ..tv
    };
    // The reference, per sequence, in parallel over the sequences (once per case).
    let refs: &Refs = refs.get_or_insert_with(|| {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..c.batch)
                .map(|bi| {
                    let (lq, lk) = lens[bi];
                    let (tq0, tk0, tv0) = (tq0, tk0, tv0);
                    let hbuf_q = &hbuf_q;
                    s.spawn(move || {
                        let gather = |host: &[u16], t: &TensorArg, which: usize, len: usize, h: usize, d: usize| {
                            let mut out = Vec::with_capacity(len * h * d);
                            for si in 0..len {
                                for hh in 0..h {
                                    for cc in 0..d {
                                        let o = t.ptr as usize + off(t, bidx(bi), tok(bi, which) + si, hh, cc);
                                        out.push(from_bits(host[o], dt));
                                    }
                                }
                            }
                            out
                        };
                        let q = gather(hbuf_q, &tq0, 0, lq, hq, dq);
                        let k = gather(host_k, &tk0, 1, lk, hkv, dq);
                        let v = gather(host_v, &tv0, 1, lk, hkv, dv);
                        attention_fwd(&RefProblem {
                            q: &q,
                            k: &k,
                            v: &v,
                            seqlen_q: lq,
                            seqlen_k: lk,
                            heads_q: hq,
                            heads_kv: hkv,
                            d_qk: dq,
                            d_v: dv,
                            scale,
                            softcap: c.softcap as f64,
                            mask: spec.mask,
                            window: (c.window.0 as i64, c.window.1 as i64),
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("reference thread"))
                .collect()
        })
    });
    for bi in 0..c.batch {
        let (lq, _) = lens[bi];
        let (ro, rl) = &refs[bi];
        for si in 0..lq {
            for h in 0..hq {
                for cc in 0..dv {
                    let o = off(&to, bidx(bi), tok(bi, 0) + si, h, cc);
                    written[o] = true;
                    let got = from_bits(o_dev[o], dt);
                    let want = ro[(si * hq + h) * dv + cc];
                    if !got.is_finite() {
                        if problems.len() < 5 {
                            problems.push(format!("O[b{bi} s{si} h{h} c{cc}] = {got} (unwritten or NaN)"));
                        }
                        err2 = f64::INFINITY;
                    } else {
                        err2 += (got - want).powi(2);
                    }
                    ref2 += want * want;
                }
                let li = if is_thd {
                    h * total_q + cu_q[bi] as usize + si
                } else {
                    (bi * hq + h) * sq_max + si
                };
                let got = lse_dev[li] as f64;
                let want = rl[h * lq + si];
                if want == f64::NEG_INFINITY {
                    if got != f64::NEG_INFINITY && problems.len() < 5 {
                        problems.push(format!("LSE[b{bi} h{h} s{si}] = {got}, want -inf (row sees no key)"));
                    }
                } else if !got.is_finite() {
                    lse_max_abs = f64::INFINITY;
                } else {
                    lse_max_abs = lse_max_abs.max((got - want).abs());
                }
            }
        }
    }
    let unwritten_gap_changed = o_dev
        .iter()
        .zip(&written)
        .filter(|(v, w)| !**w && **v != 0xffff)
        .count();
    if unwritten_gap_changed > 0 {
        problems.push(format!(
            "{unwritten_gap_changed} elements outside the logical O were overwritten"
        ));
    }
    let o_rel = if ref2 > 0.0 { (err2 / ref2).sqrt() } else { err2.sqrt() };
    Outcome {
        pairs,
        o_rel,
        lse_max_abs,
        problems,
    }
}

/// Error bounds per dtype: relative L2 error of O; max abs error of LSE.
fn bounds(dt: DType) -> (f64, f64) {
    match dt {
        DType::Bf16 => (1.5e-2, 2e-2),
        DType::F16 => (3e-3, 5e-3),
    }
}

/// `harness = false`: a plain main, so the skip line is printed in CI logs.
fn main() {
    gpu_forward_matches_f64_reference();
    println!("gpu_fwd: done");
}

/// The forward kernels a spec runs as on this device: the planner's choice,
/// and for sm90a specs also the sm80 instruction path built for sm90a (the
/// planner routes there what the wgmma template does not take), so that one
/// H200 run checks both templates on every case. The wgmma kernel's two
/// entries run on every case: the launcher's choice, the walk on 3 blocks
/// (so that every block walks several work tiles, the suite's problems
/// having fewer tiles than the device has SMs, and the ring and Q barriers
/// carry across tiles) and the one-tile entry (ragged: in both sequence
/// orders, longest keys first and batch order, as the sm80-path forward
/// without a mask).
fn kernels_for(spec: &AttnSpec) -> Vec<(&'static str, attnforge::CompiledKernel, Entry)> {
    use attnforge::plan::{
        default_fwd_tiles, default_sm90a_tiles, fwd_tile_candidates, mid_keys_tiles, plan_fwd_sm80_with,
        plan_fwd_sm90a_with, plan_variant, short_keys_tiles, FwdTiles, GridRule, Sm90aFwdTiles, Template, Variant,
    };
    let planned = attnforge::get_or_build(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let mut v = vec![(planned.plan.template.file(), (*planned).clone(), Entry::Rule)];
    let mut jobs = Vec::new();
    if planned.plan.template == Template::FwdSm90a {
        let base = default_sm90a_tiles(spec);
        assert_eq!(
            planned.plan.grid,
            GridRule::TilesOrWalk,
            "{spec}: the planner's wgmma kernel has both entries"
        );
        v.push(("fwd_sm90a.cu walk on 3 blocks", (*planned).clone(), Entry::Cap(3)));
        v.push((
            "fwd_sm90a.cu one tile per block",
            (*planned).clone(),
            Entry::Cap(launch::ONE_TILE),
        ));
        // Causal dense blocks in three phases by length (common/order.cuh),
        // whatever the rule would take for the case's query blocks.
        if matches!(
            spec.mask,
            attnforge::Mask::CausalTopLeft | attnforge::Mask::CausalBottomRight
        ) && spec.layout == attnforge::Layout::Dense
        {
            v.push((
                "fwd_sm90a.cu one tile per block, 3 phases",
                (*planned).clone(),
                Entry::Phases(3),
            ));
        }
        // Ragged: the one-tile entry above takes the sequences in the default
        // order (launch::RAGGED_ORDER_DEFAULT), this one in the other
        // (longest keys first, common/order.cuh, or batch order).
        if spec.layout == attnforge::Layout::Thd {
            v.push((
                "fwd_sm90a.cu one tile per block, other ragged order",
                (*planned).clone(),
                Entry::OtherRaggedOrder,
            ));
            // The walk in both orders: on 3 blocks the default order's table
            // holds the smaller cases' rounds (at most SM90A_WALK_ORDER_ROUNDS;
            // larger ones keep tile_at's order), on 32 blocks every case's.
            v.push((
                "fwd_sm90a.cu walk on 3 blocks, other ragged order",
                (*planned).clone(),
                Entry::WalkOtherRaggedOrder(3),
            ));
            v.push(("fwd_sm90a.cu walk on 32 blocks", (*planned).clone(), Entry::Cap(32)));
        }
        // The other tile order (query-block-major; the default is head-major),
        // with the other form of the row sums (FADD in the softmax where the
        // planner takes them from the tensor cores) and, under a causal mask,
        // the query blocks aligned to the start (the partial block last).
        let tiles = Sm90aFwdTiles {
            head_major: !base.head_major,
            rowsum_mma: !base.rowsum_mma,
            tail_first: !base.tail_first,
            ..base
        };
        jobs.push((
            "fwd_sm90a.cu query-block-major order, other row sums and alignment",
            plan_fwd_sm90a_with(spec, tiles),
            Entry::Rule,
        ));
        // The clusters-of-two option (K/V multicast; not the default) where
        // the spec allows it: one tile per block as pairs where the query
        // blocks pair up, and the same entry with every block alone.
        let pairs = plan_fwd_sm90a_with(spec, Sm90aFwdTiles { cluster: true, ..base });
        if pairs.cluster_m > 1 {
            jobs.push((
                "fwd_sm90a.cu clusters-of-two option",
                pairs.clone(),
                Entry::Cap(launch::ONE_TILE),
            ));
            jobs.push(("fwd_sm90a.cu clusters-of-two option, alone", pairs, Entry::Alone));
        }
        // The other consumer count where both fit: 3 warpgroups up to d128
        // (default at d <= 64), 2 otherwise.
        let dmax = spec.head_dim_qk.max(spec.head_dim_v);
        if dmax <= 128 {
            let tiles = if base.consumers == 3 {
                Sm90aFwdTiles {
                    consumers: 2,
                    block_n: if dmax <= 64 { 192 } else { 128 },
                    ..base
                }
            } else {
                Sm90aFwdTiles {
                    consumers: 3,
                    block_n: 80,
                    ..base
                }
            };
            if Some(tiles) != short_keys_tiles(spec) && Some(tiles) != mid_keys_tiles(spec) {
                jobs.push((
                    "fwd_sm90a.cu other consumer count",
                    plan_fwd_sm90a_with(spec, tiles),
                    Entry::Rule,
                ));
            }
        }
        // One consumer warpgroup (no ping-pong) and several blocks per SM
        // (session 38's tune alternatives), on both entries, up to d128; the
        // launcher's entry only where the short-keys variant job below does
        // not already run these tiles (d <= 64 causal).
        if dmax <= 128 {
            let tiles = Sm90aFwdTiles {
                consumers: 1,
                block_n: 64,
                stages: 2,
                blocks_per_sm: if dmax <= 64 { 3 } else { 2 },
                ..base
            };
            let multi = plan_fwd_sm90a_with(spec, tiles);
            if Some(tiles) != short_keys_tiles(spec) {
                jobs.push(("fwd_sm90a.cu one consumer, blocks per SM", multi.clone(), Entry::Rule));
            }
            jobs.push((
                "fwd_sm90a.cu one consumer, blocks per SM, walk on 3 blocks",
                multi,
                Entry::Cap(3),
            ));
        }
        // O through shared memory by TMA stores (an option, off by default;
        // dense), on the planner's tiles where its staging fits.
        let tma_o = plan_fwd_sm90a_with(
            spec,
            Sm90aFwdTiles {
                tma_store_o: true,
                ..base
            },
        );
        if tma_o.tma_store_o {
            jobs.push(("fwd_sm90a.cu TMA O stores (option)", tma_o.clone(), Entry::Rule));
            jobs.push((
                "fwd_sm90a.cu TMA O stores (option), walk on 3 blocks",
                tma_o,
                Entry::Cap(3),
            ));
        }
        // Q in registers, S by register-sourced wgmma (an option, off by
        // default; up to d128), on two consumers at block_n 128, where its
        // registers fit: both entries.
        if dmax <= 128 {
            let q_regs = plan_fwd_sm90a_with(
                spec,
                Sm90aFwdTiles {
                    q_regs: true,
                    consumers: 2,
                    block_n: 128,
                    stages: 2,
                    blocks_per_sm: 1,
                    ..base
                },
            );
            assert!(q_regs.q_regs, "{spec}: Q in registers planned up to d128");
            jobs.push(("fwd_sm90a.cu Q in registers (option)", q_regs.clone(), Entry::Rule));
            jobs.push((
                "fwd_sm90a.cu Q in registers (option), walk on 3 blocks",
                q_regs,
                Entry::Cap(3),
            ));
        }
        // The variant that calls with short keys take (plan::short_keys_tiles_why),
        // on the launcher's entry for the case.
        if let Some(short) = plan_variant(spec, Variant::ShortKeys).unwrap_or_else(|e| panic!("{spec}: {e}")) {
            jobs.push(("fwd_sm90a.cu short-keys variant", short, Entry::Rule));
        }
        // And the one for mid-length keys (plan::mid_keys_tiles_why, Variant::keys).
        if let Some(mid) = plan_variant(spec, Variant::MidKeys).unwrap_or_else(|e| panic!("{spec}: {e}")) {
            jobs.push(("fwd_sm90a.cu mid-keys variant", mid, Entry::Rule));
        }
    }
    let sm80 = default_fwd_tiles(spec);
    if planned.plan.template != Template::FwdSm80 {
        jobs.push((Template::FwdSm80.file(), plan_fwd_sm80_with(spec, sm80), Entry::Rule));
    }
    // The sm80-path forward in its other block order (head-major is an
    // option).
    let other = plan_fwd_sm80_with(
        spec,
        FwdTiles {
            head_major: !sm80.head_major,
            ..sm80
        },
    );
    jobs.push(("fwd_sm80.cu other block order", other, Entry::Rule));
    // Ragged without a mask: the sm80-path forward in the other sequence order
    // too (the launcher's default takes the longest keys first,
    // common/order.cuh; under masks the template keeps the grid's order).
    if spec.layout == attnforge::Layout::Thd && spec.mask == attnforge::Mask::None {
        jobs.push((
            "fwd_sm80.cu other ragged order",
            plan_fwd_sm80_with(spec, sm80),
            Entry::OtherRaggedOrder,
        ));
    }
    // The other tile shapes that `gpu_bench --tune` times for the head dim,
    // each once (the arch's shared memory may shrink two to one plan).
    let shape = |p: &attnforge::plan::KernelPlan| (p.num_warps, p.block_m, p.block_n, p.stages);
    let mut seen = vec![shape(&plan_fwd_sm80_with(spec, sm80))];
    for t in fwd_tile_candidates(spec) {
        let plan = plan_fwd_sm80_with(
            spec,
            FwdTiles {
                head_major: sm80.head_major,
                ..t
            },
        );
        if !seen.contains(&shape(&plan)) {
            seen.push(shape(&plan));
            jobs.push(("fwd_sm80.cu tune candidate", plan, Entry::Rule));
        }
    }
    // The other kernels compile in parallel (two entries each take NVRTC
    // about twice as long), in the order of `jobs`.
    let built: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|(name, plan, entry)| {
                s.spawn(move || {
                    let k = attnforge::jit::build_plan(plan).unwrap_or_else(|e| panic!("{spec} ({name}): {e}"));
                    (name, k, entry)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("build thread")).collect()
    });
    v.extend(built);
    // Head-major dense causal grids also in three phases by length, whatever
    // the rule would take for the case's query blocks (the same kernel as
    // the head-major one above, built once).
    if matches!(
        spec.mask,
        attnforge::Mask::CausalTopLeft | attnforge::Mask::CausalBottomRight
    ) && spec.layout == attnforge::Layout::Dense
    {
        let head_major = v
            .iter()
            .find(|(_, k, _)| k.plan.template == Template::FwdSm80 && k.plan.head_major)
            .map(|(_, k, _)| k.clone())
            .unwrap_or_else(|| panic!("{spec}: no head-major sm80-path forward among the jobs"));
        v.push(("fwd_sm80.cu head-major, 3 phases", head_major, Entry::Phases(3)));
    }
    v
}

fn gpu_forward_matches_f64_reference() {
    let Some((cc, device_arch)) = common::gpu_or_skip("gpu_fwd") else {
        return;
    };
    let seed = common::seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut table = String::new();
    let _ = writeln!(table, "seed {seed}, device compute capability {}.{}\n", cc.0, cc.1);
    let _ = writeln!(table, "| spec | template | batch x heads (q/kv) | lens (q,k) | memory | window | softcap | O rel err | bound | LSE max abs | result |");
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|---|---|---|");
    let mut failed = 0;
    for c in cases() {
        if !common::selected(c.spec) {
            continue;
        }
        // The table names the sm80 instruction path; SASS does not run across
        // major versions, so an sm80 spec runs as its sm90a build on Hopper.
        let mut spec: AttnSpec = c.spec.parse().unwrap();
        if spec.arch == attnforge::Arch::Sm90a && cc != (9, 0) {
            continue;
        }
        if cc.0 != 8 {
            spec = spec.with_arch(device_arch);
        }
        let case_seed: u64 = rng.gen();
        let mut refs = None;
        for (path, kernel, entry) in kernels_for(&spec) {
            let out = run_case(&c, &kernel, entry, case_seed, &mut refs);
            let (ob, lb) = bounds(spec.dtype);
            let ok = out.o_rel <= ob && out.lse_max_abs <= lb && out.problems.is_empty();
            if !ok {
                failed += 1;
            }
            let pairs = if out.pairs { " (pairs)" } else { "" };
            let lens = if c.lens.len() > 3 {
                format!("{:?}…", &c.lens[..3])
            } else {
                format!("{:?}", c.lens)
            };
            let _ = writeln!(
                table,
                "| {} | {}{} | {} x {}/{} | {} | {:?} | {:?} | {} | {:.2e} | {:.1e} | {:.2e} | {} |",
                spec,
                path,
                pairs,
                c.batch,
                c.heads_q,
                c.heads_kv,
                lens,
                c.mem,
                c.window,
                c.softcap,
                out.o_rel,
                ob,
                out.lse_max_abs,
                if ok {
                    "ok".to_string()
                } else {
                    format!("FAIL {}", out.problems.join("; "))
                }
            );
            println!(
                "{} {} [{}{}] o_rel={:.2e} lse={:.2e} {:?}",
                if ok { "ok  " } else { "FAIL" },
                spec,
                path,
                pairs,
                out.o_rel,
                out.lse_max_abs,
                out.problems
            );
        }
    }
    println!("\n{table}");
    if let Ok(dir) = std::env::var("ATTNFORGE_REPORT_DIR") {
        let _ = std::fs::write(std::path::Path::new(&dir).join("gpu-correctness.md"), &table);
    }
    if failed > 0 {
        eprintln!("gpu_fwd: {failed} GPU correctness case(s) failed");
        std::process::exit(1);
    }
}
