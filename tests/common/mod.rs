//! Host helpers shared by the GPU suites (`gpu_fwd`, `gpu_bwd`): device
//! buffers, element conversion, a normal sampler, tensor offsets.
#![allow(dead_code)] // each suite uses a subset

use attnforge::launch::TensorArg;
use attnforge::DType;
use cudarc::driver::result;

/// Minimal normal sampler (Box-Muller) so the suites need no extra crate.
pub fn normal<R: rand::Rng>(rng: &mut R) -> f64 {
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// A device allocation, freed on drop.
pub struct Buf {
    pub ptr: u64,
    pub bytes: usize,
}

impl Buf {
    pub fn new(bytes: usize) -> Buf {
        let bytes = bytes.max(16);
        // SAFETY: plain device allocation in the current context.
        let ptr = unsafe { result::malloc_sync(bytes) }.expect("cuMemAlloc");
        Buf { ptr, bytes }
    }
    pub fn upload<T>(data: &[T]) -> Buf {
        let b = Buf::new(std::mem::size_of_val(data));
        // SAFETY: b holds at least size_of_val(data) bytes.
        unsafe { result::memcpy_htod_sync(b.ptr, data) }.expect("cuMemcpyHtoD");
        b
    }
    /// Fill with 0xFF bytes (NaN for f16, bf16 and f32).
    pub fn poison(&self) {
        // SAFETY: the whole allocation.
        unsafe { result::memset_d8_sync(self.ptr, 0xff, self.bytes) }.expect("cuMemsetD8");
    }
    pub fn download<T: Copy + Default>(&self, n: usize) -> Vec<T> {
        let mut v = vec![T::default(); n];
        // SAFETY: n elements fit in the allocation.
        unsafe { result::memcpy_dtoh_sync(&mut v, self.ptr) }.expect("cuMemcpyDtoH");
        v
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_sync.
        unsafe {
            let _ = result::free_sync(self.ptr);
        }
    }
}

pub fn to_bits(x: f64, dt: DType) -> u16 {
    match dt {
        DType::F16 => half::f16::from_f64(x).to_bits(),
        DType::Bf16 => half::bf16::from_f64(x).to_bits(),
    }
}

pub fn from_bits(b: u16, dt: DType) -> f64 {
    match dt {
        DType::F16 => half::f16::from_bits(b).to_f64(),
        DType::Bf16 => half::bf16::from_bits(b).to_f64(),
    }
}

/// Element offset of (batch, token, head, col) in a tensor argument.
pub fn off(t: &TensorArg, b: usize, s: usize, h: usize, c: usize) -> usize {
    (t.stride_batch * b as i64 + t.stride_seq * s as i64 + t.stride_head * h as i64) as usize + c
}

/// The device a GPU suite runs on: compute capability and attnforge arch, or
/// `None` after printing `<suite>: skipped: <why>` (no driver, no usable
/// device, an arch we do not target), so CI logs say why nothing ran.
pub fn gpu_or_skip(suite: &str) -> Option<((i32, i32), attnforge::Arch)> {
    use attnforge::launch;
    if !launch::driver_available() {
        println!(
            "{suite}: skipped: no CUDA driver on this machine (the GPU suite runs on the H200 via `make gpu-test`)"
        );
        return None;
    }
    if let Err(e) = launch::ensure_context(0) {
        println!("{suite}: skipped: no usable CUDA device ({e})");
        return None;
    }
    let cc = launch::current_compute_capability().expect("compute capability");
    let Some(arch) = attnforge::Arch::from_compute_capability(cc.0, cc.1) else {
        println!(
            "{suite}: skipped: compute capability {}.{} is not an attnforge target",
            cc.0, cc.1
        );
        return None;
    };
    Some((cc, arch))
}

/// Whether a case runs: `ATTNFORGE_GPU_CASES` unset, or one of its
/// comma-separated parts is a substring of the case's spec (`thd,causal`:
/// every ragged case and every causal one).
pub fn selected(spec: &str) -> bool {
    match std::env::var("ATTNFORGE_GPU_CASES") {
        Ok(only) => only.split(',').any(|part| spec.contains(part)),
        Err(_) => true,
    }
}

/// The seed of this run: `ATTNFORGE_SEED`, else the clock.
pub fn seed() -> u64 {
    std::env::var("ATTNFORGE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// How the tensors of a dense case sit in memory.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(dead_code)] // each suite uses the layouts it can build
pub enum Mem {
    Bshd,
    Bhsd,
    /// Q, K and V as views into one packed `[b, s, 3, h, d]` buffer (heads_q == heads_kv); forward suite.
    PackedQkv,
    /// Q, K, V, O in BSHD; dO, dQ, dK, dV in BHSD (catches mixed-up strides); backward suite.
    Mixed,
}

/// One row of a suite's table.
#[derive(Clone, Debug)]
pub struct Case {
    pub spec: &'static str,
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// Dense: one (sq, sk) for all batch entries. THD: one pair per sequence.
    pub lens: Vec<(usize, usize)>,
    pub mem: Mem,
    pub window: (i32, i32),
    pub softcap: f32,
    /// K scaled by a factor that moves linearly from 1 to `1 + key_ramp` along
    /// the keys (dense BSHD: key position; THD: token index): scores that keep
    /// growing (or, negative, shrinking) far past one key tile's spread, so
    /// that a forward's running max is raised again and again (forward suite).
    pub key_ramp: f32,
}

/// A dense case: `b` sequences of (sq, sk), BSHD unless `.mem(..)` says otherwise.
pub fn dense(spec: &'static str, b: usize, hq: usize, hkv: usize, sq: usize, sk: usize) -> Case {
    Case {
        spec,
        batch: b,
        heads_q: hq,
        heads_kv: hkv,
        lens: vec![(sq, sk)],
        mem: Mem::Bshd,
        window: (-1, -1),
        softcap: 0.0,
        key_ramp: 0.0,
    }
}

/// A ragged (THD) case, one (sq, sk) per sequence.
pub fn thd(spec: &'static str, hq: usize, hkv: usize, lens: &[(usize, usize)]) -> Case {
    Case {
        spec,
        batch: lens.len(),
        heads_q: hq,
        heads_kv: hkv,
        lens: lens.to_vec(),
        mem: Mem::Bshd,
        window: (-1, -1),
        softcap: 0.0,
        key_ramp: 0.0,
    }
}

impl Case {
    pub fn mem(mut self, m: Mem) -> Self {
        self.mem = m;
        self
    }
    pub fn window(mut self, l: i32, r: i32) -> Self {
        self.window = (l, r);
        self
    }
    pub fn softcap(mut self, c: f32) -> Self {
        self.softcap = c;
        self
    }
    pub fn key_ramp(mut self, r: f32) -> Self {
        self.key_ramp = r;
        self
    }
}
