//! attnforge: a compiler of specialized attention (SDPA) kernels.
//!
//! The pipeline, one module per stage:
//! [`spec`] → [`plan`](mod@plan) → [`render`] → [`compile`] → cache (`attnforge-cache`) →
//! [`launch`]; [`jit`] strings the stages together behind
//! [`get_or_build`]. See `docs/ARCHITECTURE.md`.

pub mod capi;
pub mod compile;
pub mod dispatch;
pub mod error;
pub mod jit;
pub mod launch;
pub mod launch_bwd;
pub mod matrix;
pub mod plan;
pub mod reference;
pub mod render;
pub mod spec;

pub use error::{Error, PlanError, RenderError, SpecError};
pub use jit::{get_or_build, CompiledKernel, Jit, Origin};
pub use plan::{plan, KernelPlan};
pub use spec::{Arch, AttnSpec, DType, Direction, Layout, Mask};
