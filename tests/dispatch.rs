//! Dispatch from outside the crate: concurrency of the decision memo, and —
//! with a CUDA GPU — the whole path through the C ABI and `Dispatcher::fwd`,
//! checked against the f64 reference. Without a GPU the GPU tests print a
//! skip line and pass.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;
use std::time::Instant;

use attnforge::capi::*;
use attnforge::dispatch::{ComputeCapability, Dispatcher, ElemType, FwdCall, LseLayout, Policy, Problem, GENERATED};
use attnforge::launch::{self, TensorArg};
use attnforge::reference::{attention_fwd, RefProblem};
use attnforge::{DType, Mask};
use cudarc::driver::result;
use rand::{Rng, SeedableRng};

#[test]
fn concurrent_first_calls_decide_and_log_once() {
    let d = Arc::new(Dispatcher::capturing(Policy::auto().with_debug(true)));
    d.register_torch().unwrap();
    let problems: Vec<Problem> = (0..4)
        .map(|i| {
            let p = Problem::dense(ElemType::Bf16, 64, 1, 8, 8, 128, 128, ComputeCapability::new(9, 0));
            match i {
                0 => p,
                1 => p.with_attn_mask(),
                2 => p.with_dropout(0.1),
                _ => p.with_mask(Mask::CausalTopLeft),
            }
        })
        .collect();
    std::thread::scope(|s| {
        for t in 0..8 {
            let d = d.clone();
            let problems = problems.clone();
            s.spawn(move || {
                for i in 0..200 {
                    let p = problems[(i + t) % problems.len()];
                    d.decide_problem(&p).unwrap();
                }
            });
        }
    });
    assert_eq!(d.memo_len(), 4);
    let log = d.captured_log();
    assert_eq!(log.len(), 4, "{log:#?}");
}

fn gpu() -> bool {
    let ok = launch::driver_available() && launch::ensure_context(0).is_ok();
    if !ok {
        eprintln!("skipped: no CUDA driver/GPU");
    }
    ok
}

struct Dev(u64);

impl Dev {
    fn upload<T: Copy>(host: &[T]) -> Dev {
        // SAFETY: a fresh allocation of the host slice's size, then a copy into it.
        unsafe {
            let p = result::malloc_sync(std::mem::size_of_val(host).max(16)).expect("cuMemAlloc");
            if !host.is_empty() {
                result::memcpy_htod_sync(p, host).expect("htod");
            }
            Dev(p)
        }
    }
    fn poisoned(bytes: usize) -> Dev {
        // SAFETY: a fresh allocation, filled with 0xFF (NaN in every float type).
        unsafe {
            let p = result::malloc_sync(bytes.max(16)).expect("cuMemAlloc");
            result::memset_d8_sync(p, 0xFF, bytes.max(16)).expect("memset");
            Dev(p)
        }
    }
    fn download<T: Copy + Default>(&self, n: usize) -> Vec<T> {
        let mut v = vec![T::default(); n];
        // SAFETY: the buffer holds at least n elements; the default stream is synchronous here.
        unsafe { result::memcpy_dtoh_sync(&mut v, self.0).expect("dtoh") };
        v
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: allocated above, freed once.
        unsafe {
            let _ = result::free_sync(self.0);
        }
    }
}

fn to_bits(x: f64, dt: DType) -> u16 {
    match dt {
        DType::F16 => half::f16::from_f64(x).to_bits(),
        DType::Bf16 => half::bf16::from_f64(x).to_bits(),
    }
}

fn from_bits(b: u16, dt: DType) -> f64 {
    match dt {
        DType::F16 => half::f16::from_bits(b).to_f64(),
        DType::Bf16 => half::bf16::from_bits(b).to_f64(),
    }
}

/// Random `[n]` values rounded to `dt`: (device bits, the exact f64 values).
fn random(n: usize, dt: DType, rng: &mut rand::rngs::StdRng) -> (Vec<u16>, Vec<f64>) {
    let bits: Vec<u16> = (0..n).map(|_| to_bits(rng.gen_range(-1.0..1.0), dt)).collect();
    let vals = bits.iter().map(|&b| from_bits(b, dt)).collect();
    (bits, vals)
}

/// Compare one sequence's O (`[sq, hq, d]` at `o`) and LSE rows with the reference.
fn check_seq(what: &str, o: &[f64], lse: &dyn Fn(usize, usize) -> f32, r: &RefProblem, worst: &mut (f64, f64)) {
    let (ro, rl) = attention_fwd(r);
    for (i, (a, b)) in o.iter().zip(&ro).enumerate() {
        let e = (a - b).abs();
        assert!(e < 2e-2, "{what}: O[{i}] = {a}, reference {b}");
        worst.0 = worst.0.max(e);
    }
    for h in 0..r.heads_q {
        for i in 0..r.seqlen_q {
            let (got, want) = (lse(h, i) as f64, rl[h * r.seqlen_q + i]);
            if want == f64::NEG_INFINITY {
                assert_eq!(got, want, "{what}: LSE[{h},{i}]");
            } else {
                assert!(
                    (got - want).abs() < 1e-3,
                    "{what}: LSE[{h},{i}] = {got}, reference {want}"
                );
                worst.1 = worst.1.max((got - want).abs());
            }
        }
    }
}

#[test]
fn gpu_dense_forward_through_the_c_abi() {
    if !gpu() {
        return;
    }
    let dt = DType::Bf16;
    let (b, hq, hkv, sq, sk, d) = (2usize, 4usize, 2usize, 100usize, 130usize, 64usize);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (qb, qv) = random(b * sq * hq * d, dt, &mut rng);
    let (kb, kv) = random(b * sk * hkv * d, dt, &mut rng);
    let (vb, vv) = random(b * sk * hkv * d, dt, &mut rng);
    let (q, k, v) = (Dev::upload(&qb), Dev::upload(&kb), Dev::upload(&vb));
    let o = Dev::poisoned(b * sq * hq * d * 2);
    let lse = Dev::poisoned(b * hq * sq * 4);
    let t = |p: &Dev, s: usize, h: usize| AttnforgeTensor {
        ptr: p.0 as *mut c_void,
        stride_batch: (s * h * d) as i64,
        stride_seq: (h * d) as i64,
        stride_head: d as i64,
    };
    let problem = AttnforgeProblem {
        size: std::mem::size_of::<AttnforgeProblem>() as u32,
        dtype: ATTNFORGE_DTYPE_BF16,
        layout: ATTNFORGE_LAYOUT_DENSE,
        mask: ATTNFORGE_MASK_CAUSAL_BOTTOM_RIGHT,
        head_dim_qk: d as u32,
        head_dim_v: d as u32,
        batch: b as u32,
        heads_q: hq as u32,
        heads_kv: hkv as u32,
        seqlen_q: sq as u32,
        seqlen_k: sk as u32,
        total_q: 0,
        total_k: 0,
        window_left: -1,
        window_right: -1,
        scale: 0.0,
        softcap: 0.0,
        dropout_p: 0.0,
        flags: ATTNFORGE_FLAG_REQUIRES_GRAD,
        cc_major: 0, // ask the device
        cc_minor: 0,
        reserved: 0,
        cu_seqlens_q: std::ptr::null(),
        cu_seqlens_k: std::ptr::null(),
    };
    let (tq, tk, tv, to) = (t(&q, sq, hq), t(&k, sk, hkv), t(&v, sk, hkv), t(&o, sq, hq));
    let mut ctx = std::mem::MaybeUninit::<AttnforgeFwdContext>::zeroed();
    // SAFETY: device buffers sized for the shapes above, legacy default stream.
    let rc = unsafe {
        attnforge_fwd(
            &problem,
            &tq,
            &tk,
            &tv,
            &to,
            lse.0 as *mut f32,
            std::ptr::null_mut(),
            ctx.as_mut_ptr(),
        )
    };
    let mut msg = vec![0 as c_char; 1024];
    // SAFETY: buffer of msg.len() bytes.
    unsafe { attnforge_last_error(msg.as_mut_ptr(), msg.len()) };
    // SAFETY: NUL-terminated by attnforge_last_error.
    let msg = unsafe { CStr::from_ptr(msg.as_ptr()) }.to_string_lossy().into_owned();
    assert_eq!(rc, ATTNFORGE_OK, "{msg}");
    // SAFETY: written by attnforge_fwd on success.
    let ctx = unsafe { ctx.assume_init() };
    // SAFETY: NUL-terminated by the library.
    let producer = unsafe { CStr::from_ptr(ctx.backend.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(producer, GENERATED);
    assert_eq!(
        (ctx.lse_layout, ctx.lse_dims),
        (ATTNFORGE_LSE_DENSE, [b as u32, hq as u32, sq as u32])
    );

    let o_host: Vec<u16> = o.download(b * sq * hq * d);
    let lse_host: Vec<f32> = lse.download(b * hq * sq);
    let mut worst = (0.0, 0.0);
    for bi in 0..b {
        let r = RefProblem {
            q: &qv[bi * sq * hq * d..][..sq * hq * d],
            k: &kv[bi * sk * hkv * d..][..sk * hkv * d],
            v: &vv[bi * sk * hkv * d..][..sk * hkv * d],
            seqlen_q: sq,
            seqlen_k: sk,
            heads_q: hq,
            heads_kv: hkv,
            d_qk: d,
            d_v: d,
            scale: ctx.scale as f64,
            softcap: 0.0,
            mask: Mask::CausalBottomRight,
            window: (-1, -1),
        };
        let og: Vec<f64> = o_host[bi * sq * hq * d..][..sq * hq * d]
            .iter()
            .map(|&x| from_bits(x, dt))
            .collect();
        let lse_at = |h: usize, i: usize| lse_host[(bi * hq + h) * sq + i];
        check_seq(&format!("dense batch {bi}"), &og, &lse_at, &r, &mut worst);
    }
    eprintln!("dense via C ABI: max |dO| {:.2e}, max |dLSE| {:.2e}", worst.0, worst.1);

    // Host time of a seen problem, launch included (kernels queue on the default stream).
    let mut samples = Vec::new();
    for _ in 0..21 {
        let n = 200;
        let t0 = Instant::now();
        for _ in 0..n {
            // SAFETY: as above.
            let rc = unsafe {
                attnforge_fwd(
                    &problem,
                    &tq,
                    &tk,
                    &tv,
                    &to,
                    lse.0 as *mut f32,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(rc, ATTNFORGE_OK);
        }
        samples.push(t0.elapsed().as_nanos() as f64 / n as f64);
        result::ctx::synchronize().expect("sync"); // drain the queued launches
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    eprintln!(
        "attnforge_fwd host time per call, problem seen before, cuLaunchKernel included: median {:.0} ns (min {:.0})",
        samples[samples.len() / 2],
        samples[0]
    );
}

#[test]
fn gpu_ragged_forward_through_the_dispatcher() {
    if !gpu() {
        return;
    }
    let dt = DType::F16;
    let (hq, hkv, d) = (4usize, 1usize, 128usize);
    let lens = [5usize, 0, 64, 33];
    let mut cu = vec![0i32];
    for l in lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    let total = *cu.last().unwrap() as usize;
    let max = *lens.iter().max().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (qb, qv) = random(total * hq * d, dt, &mut rng);
    let (kb, kv) = random(total * hkv * d, dt, &mut rng);
    let (vb, vv) = random(total * hkv * d, dt, &mut rng);
    let (q, k, v, cu_d) = (Dev::upload(&qb), Dev::upload(&kb), Dev::upload(&vb), Dev::upload(&cu));
    let o = Dev::poisoned(total * hq * d * 2);
    let lse = Dev::poisoned(hq * total * 4);
    let (major, minor) = launch::current_compute_capability().unwrap();
    let problem = Problem::thd(
        ElemType::F16,
        d as u32,
        lens.len() as u32,
        hq as u32,
        hkv as u32,
        (max as u32, total as u32),
        (max as u32, total as u32),
        ComputeCapability::new(major as u8, minor as u8),
    )
    .with_mask(Mask::CausalTopLeft)
    .with_thd_equal_seqlens(true);
    let mut call = FwdCall::new(
        problem,
        TensorArg::thd(q.0, hq as i64, d as i64),
        TensorArg::thd(k.0, hkv as i64, d as i64),
        TensorArg::thd(v.0, hkv as i64, d as i64),
        TensorArg::thd(o.0, hq as i64, d as i64),
        lse.0,
    );
    call.cu_seqlens_q = Some(cu_d.0);
    call.cu_seqlens_k = Some(cu_d.0);
    let ctx = Dispatcher::global().fwd(&call).unwrap();
    assert_eq!(ctx.producer, GENERATED);
    assert_eq!(
        ctx.lse_layout,
        LseLayout::Packed {
            heads: hq as u32,
            total_q: total as u32
        }
    );
    result::ctx::synchronize().expect("sync");
    let o_host: Vec<u16> = o.download(total * hq * d);
    let lse_host: Vec<f32> = lse.download(hq * total);
    let mut worst = (0.0, 0.0);
    for (bi, &len) in lens.iter().enumerate() {
        let start = cu[bi] as usize;
        let r = RefProblem {
            q: &qv[start * hq * d..][..len * hq * d],
            k: &kv[start * hkv * d..][..len * hkv * d],
            v: &vv[start * hkv * d..][..len * hkv * d],
            seqlen_q: len,
            seqlen_k: len,
            heads_q: hq,
            heads_kv: hkv,
            d_qk: d,
            d_v: d,
            scale: ctx.scale as f64,
            softcap: 0.0,
            mask: Mask::CausalTopLeft,
            window: (-1, -1),
        };
        let og: Vec<f64> = o_host[start * hq * d..][..len * hq * d]
            .iter()
            .map(|&x| from_bits(x, dt))
            .collect();
        let lse_at = |h: usize, i: usize| {
            let off = ctx.lse_layout.offset(bi as u32, h as u32, i as u32, &cu).unwrap();
            lse_host[off]
        };
        check_seq(&format!("thd sequence {bi}"), &og, &lse_at, &r, &mut worst);
    }
    eprintln!(
        "thd via Dispatcher: max |dO| {:.2e}, max |dLSE| {:.2e}",
        worst.0, worst.1
    );

    // explain with the device's own compute capability (cc_major = 0).
    let p = AttnforgeProblem {
        size: std::mem::size_of::<AttnforgeProblem>() as u32,
        dtype: ATTNFORGE_DTYPE_F16,
        layout: ATTNFORGE_LAYOUT_THD,
        mask: ATTNFORGE_MASK_CAUSAL_TOP_LEFT,
        head_dim_qk: d as u32,
        head_dim_v: d as u32,
        batch: lens.len() as u32,
        heads_q: hq as u32,
        heads_kv: hkv as u32,
        seqlen_q: max as u32,
        seqlen_k: max as u32,
        total_q: total as u32,
        total_k: total as u32,
        window_left: -1,
        window_right: -1,
        scale: 0.0,
        softcap: 0.0,
        dropout_p: 0.0,
        flags: 0,
        cc_major: 0,
        cc_minor: 0,
        reserved: 0,
        cu_seqlens_q: cu_d.0 as *const i32,
        cu_seqlens_k: cu_d.0 as *const i32,
    };
    let mut buf = vec![0 as c_char; 4096];
    // SAFETY: valid struct and buffer.
    let rc = unsafe { attnforge_explain(&p, buf.as_mut_ptr(), buf.len()) };
    assert_eq!(rc, ATTNFORGE_OK);
    // SAFETY: NUL-terminated.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    eprintln!("{text}");
    assert!(
        text.contains("forward   -> generated  spec fwd.f16.d128.causal-tl.thd."),
        "{text}"
    );
}
