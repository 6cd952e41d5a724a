//! Host time of the dispatch hot path for a problem seen before: everything
//! `Dispatcher::fwd` does in Rust before the driver's launch call.
//!
//! Timed per call: `Problem::validate` + `Problem::key` + decision memo
//! lookup (`Dispatcher::decide`) + jit memo hit (`Jit::memo_get`) +
//! `launch::check_fwd` + `FwdContext::new`. Not timed: the loaded-module memo
//! (one `cuCtxGetCurrent`) and `cuLaunchKernel` itself, which need a GPU.
//!
//! No GPU needed; NVRTC is (the kernel is compiled once, into a temporary
//! cache, to put it in the jit memo).
//!
//! usage: cargo run --release --example hotpath_bench [-- BATCHES CALLS_PER_BATCH]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use attnforge::dispatch::{
    ComputeCapability, Dispatcher, ElemType, FwdCall, FwdContext, GeneratedBackend, Policy, Problem,
};
use attnforge::jit::Jit;
use attnforge::launch::{self, TensorArg};
use attnforge::Mask;
use attnforge_cache::{Cache, CacheConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// ns per call of `f`, one sample per batch.
fn sample(batches: usize, calls: usize, mut f: impl FnMut()) -> Vec<f64> {
    for _ in 0..calls {
        f(); // warm caches and branch predictors
    }
    (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..calls {
                f();
            }
            t.elapsed().as_nanos() as f64 / calls as f64
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let batches = args.first().copied().unwrap_or(201);
    let calls = args.get(1).copied().unwrap_or(10_000);

    let dir = tempfile::tempdir()?;
    let jit: &'static Jit = Box::leak(Box::new(Jit::new(Cache::open(CacheConfig::with_user_root(dir.path())))));
    let generated = Arc::new(GeneratedBackend::new(jit));
    let dispatcher = Dispatcher::new(Policy::auto());
    dispatcher.register(generated.clone())?;
    dispatcher.register_torch()?;

    // A training-shaped problem: bf16, d128, GQA 32/8, causal, 4 x 4096.
    let (b, hq, hkv, s, d) = (4u32, 32u32, 8u32, 4096u32, 128u32);
    let problem = Problem::dense(ElemType::Bf16, d, b, hq, hkv, s, s, ComputeCapability::new(9, 0))
        .with_mask(Mask::CausalBottomRight)
        .with_grad();
    let (s, hq_, hkv_, d_) = (s as i64, hq as i64, hkv as i64, d as i64);
    let call = FwdCall::new(
        problem,
        TensorArg::bshd(0x7f00_0000_0000, s, hq_, d_),
        TensorArg::bshd(0x7f10_0000_0000, s, hkv_, d_),
        TensorArg::bshd(0x7f20_0000_0000, s, hkv_, d_),
        TensorArg::bshd(0x7f30_0000_0000, s, hq_, d_),
        0x7f40_0000_0000,
    );

    // First call: decide (cold) and build the kernel (NVRTC, into the temp cache).
    let t = Instant::now();
    let decision = dispatcher.decide_problem(&problem)?;
    let cold_decide = t.elapsed();
    let chosen = decision.fwd.chosen()?;
    let spec = chosen.spec().ok_or("the generated backend should be chosen")?;
    let t = Instant::now();
    generated.kernel(&spec)?;
    println!(
        "first call: decision {:.1} us (cold), kernel {spec} built in {:.0} ms (NVRTC, fresh cache)",
        cold_decide.as_secs_f64() * 1e6,
        t.elapsed().as_secs_f64() * 1e3
    );
    let kernel = jit.memo_get(&spec).ok_or("kernel not in the jit memo")?;
    let args = GeneratedBackend::fwd_args(&call);

    let hot = || -> Result<(), Box<dyn std::error::Error>> {
        let d = dispatcher.decide_problem(&call.problem)?;
        let c = d.fwd.chosen()?;
        let spec = c.spec().ok_or("no spec")?;
        let prepared = generated.prepare_fwd(&call, &spec)?;
        black_box(&prepared);
        black_box(FwdContext::new(generated.as_ref(), &call)?);
        Ok(())
    };
    hot()?;

    let total = sample(batches, calls, || {
        let _ = black_box(hot());
    });
    let decide = sample(batches, calls, || {
        let d = dispatcher.decide_problem(black_box(&call.problem));
        black_box(d.ok());
    });
    let memo = sample(batches, calls, || {
        black_box(jit.memo_get(black_box(&spec)));
    });
    let check = sample(batches, calls, || {
        let _ = black_box(launch::check_fwd(&kernel.plan, black_box(&args)));
    });

    println!("hot path, problem seen before ({batches} batches x {calls} calls, ns/call, median [p10, p90]):");
    for (name, v) in [
        ("validate + key + decision memo", decide),
        ("jit memo hit", memo),
        ("launch::check_fwd", check),
        ("total before the launch", total),
    ] {
        println!(
            "  {name:<32} {:>7.1}  [{:.1}, {:.1}]",
            median(v.clone()),
            percentile(v.clone(), 0.1),
            percentile(v, 0.9)
        );
    }
    Ok(())
}
