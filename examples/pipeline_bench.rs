//! Pipeline figures (no GPU needed): cold compile time per kernel over the
//! default matrix, a disk-cache hit in a new process, an in-process memo hit.
//!
//! usage: cargo run --release --example pipeline_bench [-- --specs N]
//! Prints a table; needs NVRTC (ATTNFORGE_NVRTC or discovery).

use std::process::Command;
use std::time::Instant;

use attnforge::jit::{Jit, Origin};
use attnforge::{matrix, Arch, AttnSpec};
use attnforge_cache::{Cache, CacheConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        // A new process: time one get_or_build against the warm disk cache.
        let spec: AttnSpec = args[1].parse().expect("spec");
        if args.get(2).map(String::as_str) == Some("--breakdown") {
            let t = Instant::now();
            let plan = attnforge::plan(&spec).unwrap();
            let t1 = t.elapsed();
            let r = attnforge::render::render(&plan).unwrap();
            let t2 = t.elapsed();
            let _ = attnforge::render::render(&plan).unwrap();
            let t3 = t.elapsed();
            let loc = attnforge::compile::locate_first();
            let t4 = t.elapsed();
            let cache = Cache::open(CacheConfig::from_env());
            let t5 = t.elapsed();
            let key = attnforge::jit::cache_key(&plan, &r, "13.0", &attnforge::jit::compile_options(&plan));
            let t6 = t.elapsed();
            let hit = matches!(cache.get(&key), attnforge_cache::Lookup::Hit { .. });
            let t7 = t.elapsed();
            eprintln!(
                "plan {t1:?} render1 {:?} render2 {:?} locate {:?} ({loc:?}) open {:?} key {:?} get {:?} hit={hit}",
                t2 - t1,
                t3 - t2,
                t4 - t3,
                t5 - t4,
                t6 - t5,
                t7 - t6
            );
        }
        let t = Instant::now();
        let r = Jit::global().build(&spec).expect("build");
        let us = t.elapsed().as_secs_f64() * 1e6;
        assert_eq!(r.origin, Origin::Disk, "child expected a disk hit");
        println!("{us}");
        return;
    }
    let limit: usize = args
        .iter()
        .position(|a| a == "--specs")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX);
    let tmp = std::env::temp_dir().join(format!("attnforge-pipeline-bench-{}", std::process::id()));
    let jit = Jit::new(Cache::open(CacheConfig::with_user_root(&tmp)));

    // Cold compiles, one at a time (no contention between jobs).
    let specs: Vec<AttnSpec> = matrix::default_specs(&[Arch::Sm80, Arch::Sm90a])
        .into_iter()
        .take(limit)
        .collect();
    let started = Instant::now();
    let mut cold = Vec::new();
    for s in &specs {
        let t = Instant::now();
        let r = jit.build(s).expect("compile");
        assert_eq!(r.origin, Origin::Compiled);
        cold.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let cold_wall = started.elapsed().as_secs_f64();

    // Disk hits in new processes.
    let exe = std::env::current_exe().unwrap();
    let spec = specs[specs.len() / 2].to_string();
    let mut inproc = Vec::new();
    let mut wall = Vec::new();
    for _ in 0..15 {
        let t = Instant::now();
        let out = Command::new(&exe)
            .args(["--child", &spec])
            .env("ATTNFORGE_CACHE_DIR", &tmp)
            .output()
            .unwrap();
        wall.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        inproc.push(String::from_utf8_lossy(&out.stdout).trim().parse::<f64>().unwrap());
    }

    // Memo hits.
    let s0 = specs[0];
    let n = 2_000_000;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(jit.get_or_build(std::hint::black_box(&s0)).unwrap());
    }
    let memo_ns = t.elapsed().as_secs_f64() * 1e9 / n as f64;
    let _ = std::fs::remove_dir_all(&tmp);

    println!("| figure | value | target |");
    println!("|---|---|---|");
    println!(
        "| cold compile per kernel, median of {} specs (sm80 + sm90a), one at a time | {:.0} ms (min {:.0}, max {:.0}) | <= 1 s |",
        cold.len(),
        median(cold.clone()),
        cold.iter().cloned().fold(f64::INFINITY, f64::min),
        cold.iter().cloned().fold(0.0, f64::max)
    );
    println!("| all {} cold compiles, sequential | {cold_wall:.1} s | |", cold.len());
    println!(
        "| disk hit in a new process: get_or_build, median of 15 | {:.2} ms | <= 5 ms |",
        median(inproc) / 1e3
    );
    println!(
        "| ... whole child process wall time, median | {:.1} ms | |",
        median(wall)
    );
    println!("| memo hit in process | {memo_ns:.0} ns | <= 1 us |");
}
