//! The header matches the Rust exports; the C ABI behaves.

use std::collections::BTreeMap;
use std::ffi::CStr;

use super::*;

const HEADER: &str = include_str!("../../include/attnforge.h");
const RUST: &str = include_str!("../capi.rs");

/// Drop `/* */` and `//` comments.
fn strip_comments(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, after)| after);
            out.push(' ');
        } else if let Some(r) = rest.strip_prefix("//") {
            rest = r.split_once('\n').map_or("", |(_, after)| after);
            out.push('\n');
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn matching_paren(s: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in s[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return open + i;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses");
}

fn arity(params: &str) -> usize {
    let p = params.trim();
    if p.is_empty() || p == "void" {
        return 0;
    }
    p.split(',').filter(|s| !s.trim().is_empty()).count()
}

/// `name -> parameter count` of every `attnforge_*` prototype in the header.
fn header_functions() -> BTreeMap<String, usize> {
    let text: String = strip_comments(HEADER)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeMap::new();
    for stmt in text.split(';') {
        let Some(open) = stmt.find('(') else { continue };
        let name = stmt[..open]
            .split_whitespace()
            .last()
            .unwrap_or("")
            .trim_start_matches('*');
        if !name.starts_with("attnforge_") || stmt.contains("typedef") {
            continue;
        }
        let close = matching_paren(stmt, open);
        out.insert(name.to_string(), arity(&stmt[open + 1..close]));
    }
    out
}

/// `name -> parameter count` of every `extern "C"` fn in capi.rs.
fn rust_exports() -> BTreeMap<String, usize> {
    let src = strip_comments(RUST);
    let mut out = BTreeMap::new();
    let mut rest = src.as_str();
    while let Some(i) = rest.find("extern \"C\" fn ") {
        let after = &rest[i + "extern \"C\" fn ".len()..];
        let open = after.find('(').unwrap();
        let name = after[..open].trim().to_string();
        let close = matching_paren(after, open);
        out.insert(name, arity(&after[open + 1..close]));
        rest = &after[close..];
    }
    out
}

/// Fields (name, type) of a header struct, types normalized to Rust spelling.
fn header_struct(name: &str) -> Vec<(String, String)> {
    let text = strip_comments(HEADER);
    let start = text
        .find(&format!("typedef struct {name} {{"))
        .unwrap_or_else(|| panic!("struct {name} not in header"));
    let body = &text[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    body.split(';')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (ty, field) = f.rsplit_once(|c: char| c.is_whitespace() || c == '*').unwrap();
            let pointer = f[ty.len()..].starts_with('*') || ty.ends_with('*');
            let ty = ty.trim().trim_end_matches('*').trim();
            let (field, array) = match field.split_once('[') {
                Some((f, n)) => (f, Some(n.trim_end_matches(']').to_string())),
                None => (field, None),
            };
            let base = match ty {
                "uint32_t" => "u32",
                "int32_t" => "i32",
                "int64_t" => "i64",
                "float" => "f32",
                "char" => "c_char",
                "void" => "c_void",
                "const int32_t" => "i32",
                other => panic!("unmapped C type {other:?}"),
            };
            let rust = match (pointer, array) {
                (true, _) if ty.starts_with("const") => format!("*const {base}"),
                (true, _) => format!("*mut {base}"),
                (false, Some(n)) => format!("[{base}; {n}]"),
                (false, None) => base.to_string(),
            };
            (field.trim().to_string(), rust)
        })
        .collect()
}

fn rust_struct(name: &str) -> Vec<(String, String)> {
    let src = strip_comments(RUST);
    let start = src.find(&format!("pub struct {name} {{")).unwrap();
    let body = &src[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    body.split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (n, t) = f.trim_start_matches("pub ").split_once(':').unwrap();
            (n.trim().to_string(), t.trim().to_string())
        })
        .collect()
}

fn header_constants() -> BTreeMap<String, i64> {
    HEADER
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            (it.next()? == "#define").then_some(())?;
            let name = it.next()?;
            let value = it.next()?.parse().ok()?;
            Some((name.to_string(), value))
        })
        .collect()
}

fn rust_constants() -> BTreeMap<String, i64> {
    RUST.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("pub const ATTNFORGE_")?;
            let (name, value) = rest.split_once(':')?;
            let value = value.split_once('=')?.1.trim().trim_end_matches(';').parse().ok()?;
            Some((format!("ATTNFORGE_{name}"), value))
        })
        .collect()
}

#[test]
fn header_declares_exactly_the_rust_exports() {
    let h = header_functions();
    let r = rust_exports();
    assert_eq!(h, r, "header prototypes vs extern \"C\" fns in capi.rs");
    assert_eq!(h.get("attnforge_fwd"), Some(&8));
    assert_eq!(h.get("attnforge_explain"), Some(&3));
    assert_eq!(h.get("attnforge_last_error"), Some(&2));
    assert_eq!(h.get("attnforge_bwd"), Some(&13));
    assert_eq!(h.get("attnforge_bwd_workspace_size"), Some(&2));
    // Each export has #[no_mangle] right above it.
    let src = strip_comments(RUST);
    for name in r.keys() {
        let at = src.find(&format!("fn {name}(")).unwrap();
        let before = &src[..at];
        let attr = before.rfind("#[no_mangle]").unwrap();
        assert!(!before[attr..].contains("\n}\n"), "{name} lacks #[no_mangle]");
    }
}

#[test]
fn header_structs_match_the_repr_c_structs() {
    for (c, rust) in [
        ("attnforge_problem", "AttnforgeProblem"),
        ("attnforge_tensor", "AttnforgeTensor"),
        ("attnforge_fwd_context", "AttnforgeFwdContext"),
    ] {
        assert_eq!(header_struct(c), rust_struct(rust), "{c} vs {rust}");
    }
    // The sizes the header's _Static_asserts state.
    let sizes: BTreeMap<&str, usize> = [
        ("attnforge_problem", std::mem::size_of::<AttnforgeProblem>()),
        ("attnforge_tensor", std::mem::size_of::<AttnforgeTensor>()),
        ("attnforge_fwd_context", std::mem::size_of::<AttnforgeFwdContext>()),
    ]
    .into();
    for (name, size) in sizes {
        let want = format!("_Static_assert(sizeof({name}) == {size},");
        assert!(HEADER.contains(&want), "header lacks {want}");
    }
}

#[test]
fn header_constants_match_the_rust_constants() {
    let h = header_constants();
    let mut r = rust_constants();
    assert!(r.len() >= 25, "{r:?}");
    for (name, v) in &h {
        assert_eq!(r.remove(name), Some(*v), "{name}");
    }
    assert!(r.is_empty(), "constants missing from the header: {r:?}");
}

macro_rules! offsets {
    ($t:ty, $c:literal, [$($f:ident),+ $(,)?]) => {
        (
            $c,
            std::mem::size_of::<$t>(),
            vec![$((stringify!($f), std::mem::offset_of!($t, $f))),+],
        )
    };
}

/// With a C compiler at hand, the header compiles and every size and field
/// offset agrees with Rust's layout.
#[test]
fn header_compiles_with_the_rust_layout() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if std::process::Command::new(&cc).arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler ({cc})");
        return;
    }
    let layouts = [
        offsets!(
            AttnforgeProblem,
            "attnforge_problem",
            [
                size,
                dtype,
                layout,
                mask,
                head_dim_qk,
                head_dim_v,
                batch,
                heads_q,
                heads_kv,
                seqlen_q,
                seqlen_k,
                total_q,
                total_k,
                window_left,
                window_right,
                scale,
                softcap,
                dropout_p,
                flags,
                cc_major,
                cc_minor,
                reserved,
                cu_seqlens_q,
                cu_seqlens_k
            ]
        ),
        offsets!(
            AttnforgeTensor,
            "attnforge_tensor",
            [ptr, stride_batch, stride_seq, stride_head]
        ),
        offsets!(
            AttnforgeFwdContext,
            "attnforge_fwd_context",
            [size, lse_layout, lse_dims, scale, backend]
        ),
    ];
    let mut c = String::from("#include <stddef.h>\n#include \"attnforge.h\"\n");
    for (name, size, fields) in &layouts {
        assert_eq!(
            fields.iter().map(|(f, _)| f.to_string()).collect::<Vec<_>>(),
            header_struct(name).into_iter().map(|(f, _)| f).collect::<Vec<_>>()
        );
        c += &format!("_Static_assert(sizeof({name}) == {size}, \"size of {name}\");\n");
        for (f, off) in fields {
            c += &format!("_Static_assert(offsetof({name}, {f}) == {off}, \"{name}.{f}\");\n");
        }
    }
    // The prototypes must accept the argument types the Rust side takes.
    c += "int check(void) { attnforge_problem p = {0}; attnforge_tensor t = {0}; attnforge_fwd_context x; char b[8];\n\
          return attnforge_fwd(&p, &t, &t, &t, &t, (float*)0, (void*)0, &x) + attnforge_explain(&p, b, sizeof b)\n\
          + (int)attnforge_last_error(b, sizeof b) + attnforge_abi_version() + (attnforge_status_string(0) != 0); }\n\
          int check_bwd(void) { attnforge_problem p = {0}; attnforge_tensor t = {0}; size_t n = 0; const float* lse = 0;\n\
          return attnforge_bwd_workspace_size(&p, &n) + attnforge_bwd(&p, &t, &t, &t, &t, &t, &t, &t, &t, lse, (void*)0, n, (void*)0); }\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("abi.c");
    std::fs::write(&file, c).unwrap();
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/include");
    let out = std::process::Command::new(&cc)
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-I",
            include,
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc} rejected the header or a layout differs:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn problem() -> AttnforgeProblem {
    AttnforgeProblem {
        size: std::mem::size_of::<AttnforgeProblem>() as u32,
        dtype: ATTNFORGE_DTYPE_BF16,
        layout: ATTNFORGE_LAYOUT_DENSE,
        mask: ATTNFORGE_MASK_CAUSAL_BOTTOM_RIGHT,
        head_dim_qk: 128,
        head_dim_v: 128,
        batch: 2,
        heads_q: 16,
        heads_kv: 4,
        seqlen_q: 1000,
        seqlen_k: 1000,
        total_q: 0,
        total_k: 0,
        window_left: -1,
        window_right: -1,
        scale: 0.0,
        softcap: 0.0,
        dropout_p: 0.0,
        flags: ATTNFORGE_FLAG_REQUIRES_GRAD,
        cc_major: 9,
        cc_minor: 0,
        reserved: 0,
        cu_seqlens_q: std::ptr::null(),
        cu_seqlens_k: std::ptr::null(),
    }
}

fn last_error() -> String {
    // SAFETY: NULL asks for the length; then a buffer of that size + 1.
    let n = unsafe { attnforge_last_error(std::ptr::null_mut(), 0) };
    let mut buf = vec![0 as c_char; n + 1];
    // SAFETY: buf holds n + 1 bytes.
    let m = unsafe { attnforge_last_error(buf.as_mut_ptr(), buf.len()) };
    assert_eq!(m, n);
    // SAFETY: write_text NUL-terminates.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

fn explain(p: &AttnforgeProblem, len: usize) -> (c_int, String) {
    let mut buf = vec![0 as c_char; len.max(1)];
    // SAFETY: p is a valid struct, buf holds len bytes.
    let rc = unsafe { attnforge_explain(p, buf.as_mut_ptr(), len) };
    // SAFETY: NUL-terminated on every path that writes.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    (rc, text)
}

#[test]
fn explain_works_without_a_gpu() {
    let (rc, text) = explain(&problem(), 8192);
    assert_eq!(rc, ATTNFORGE_OK, "{}", last_error());
    assert!(
        text.contains("forward   -> generated  spec fwd.bf16.d128.causal-br.dense.sm90a"),
        "{text}"
    );
    assert!(
        text.contains("backward  -> generated  spec bwd.bf16.d128.causal-br.dense.sm90a"),
        "{text}"
    );
    assert_eq!(last_error(), "");
    // Too small: cut, NUL-terminated, and the error says how much is needed.
    let (rc, cut) = explain(&problem(), 16);
    assert_eq!(rc, ATTNFORGE_ERR_TRUNCATED);
    assert_eq!(cut.len(), 15);
    assert!(text.starts_with(&cut));
    assert!(
        last_error().contains(&format!("needs {} bytes", text.len())),
        "{}",
        last_error()
    );
}

#[test]
fn bad_input_is_a_status_with_a_message() {
    // SAFETY: NULL is allowed and reported.
    let rc = unsafe { attnforge_explain(std::ptr::null(), std::ptr::null_mut(), 0) };
    assert_eq!(rc, ATTNFORGE_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "problem is NULL");
    let cases: Vec<(AttnforgeProblem, &str)> = vec![
        (AttnforgeProblem { size: 96, ..problem() }, "version skew"),
        (AttnforgeProblem { dtype: 7, ..problem() }, "problem.dtype 7"),
        (AttnforgeProblem { mask: -1, ..problem() }, "problem.mask -1"),
        (AttnforgeProblem { flags: 64, ..problem() }, "unknown bits 0x40"),
        (
            AttnforgeProblem {
                heads_kv: 5,
                ..problem()
            },
            "multiple of heads_kv",
        ),
        (
            AttnforgeProblem {
                scale: -1.0,
                ..problem()
            },
            "scale",
        ),
        (
            AttnforgeProblem {
                cc_major: 9,
                cc_minor: 12,
                ..problem()
            },
            "compute capability 9.12",
        ),
    ];
    for (p, want) in cases {
        let (rc, _) = explain(&p, 4096);
        assert_eq!(rc, ATTNFORGE_ERR_INVALID_ARGUMENT, "{want}");
        assert!(last_error().contains(want), "{want}: {}", last_error());
    }
    // SAFETY: a static NUL-terminated string.
    let s = unsafe { CStr::from_ptr(attnforge_status_string(ATTNFORGE_ERR_NO_BACKEND)) };
    assert_eq!(s.to_str().unwrap(), "no backend supports the problem");
    assert_eq!(attnforge_abi_version(), ATTNFORGE_ABI_VERSION);
}

fn tensor(ptr: usize) -> AttnforgeTensor {
    AttnforgeTensor {
        ptr: ptr as *mut c_void,
        stride_batch: 1000 * 16 * 128,
        stride_seq: 16 * 128,
        stride_head: 128,
    }
}

#[test]
fn fwd_refuses_before_compiling_or_touching_the_driver() {
    let p = problem();
    let (q, k, v, o) = (tensor(0x10000), tensor(0x20000), tensor(0x30000), tensor(0));
    // SAFETY: no device memory is touched: the call is refused at the argument check.
    let rc = unsafe {
        attnforge_fwd(
            &p,
            &q,
            &k,
            &v,
            &o,
            0x40000 as *mut f32,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, ATTNFORGE_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("`o`: null pointer"), "{}", last_error());
    // SAFETY: refused before any pointer is read.
    let rc = unsafe {
        attnforge_fwd(
            &p,
            std::ptr::null(),
            &k,
            &v,
            &o,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, ATTNFORGE_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "tensor q is NULL");
    // Dropout: the C ABI has only the generated backend, which declines.
    let p = AttnforgeProblem {
        dropout_p: 0.1,
        ..problem()
    };
    // SAFETY: refused at the decision, before any pointer is used.
    let rc = unsafe {
        attnforge_fwd(
            &p,
            &q,
            &k,
            &v,
            &q,
            0x40000 as *mut f32,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, ATTNFORGE_ERR_NO_BACKEND);
    assert!(
        last_error().contains("generated: dropout unsupported"),
        "{}",
        last_error()
    );
}

#[test]
fn panics_stop_at_the_boundary() {
    let rc = guard(|| panic!("boom"));
    assert_eq!(rc, ATTNFORGE_ERR_PANIC);
    assert_eq!(last_error(), "internal error (panic): boom");
}

#[test]
fn context_out_reports_layout_and_producer() {
    use crate::dispatch::{FwdCall, GeneratedBackend, Problem};
    let p = Problem::thd(
        ElemType::F16,
        64,
        3,
        8,
        8,
        (100, 250),
        (100, 250),
        ComputeCapability::new(8, 0),
    );
    let t = TensorArg::thd(0x1000, 8, 64);
    let ctx = FwdContext::new(&GeneratedBackend::global(), &FwdCall::new(p, t, t, t, t, 0x2000)).unwrap();
    let c = context_out(&ctx);
    assert_eq!((c.lse_layout, c.lse_dims), (ATTNFORGE_LSE_PACKED, [8, 250, 0]));
    // SAFETY: context_out NUL-terminates the name.
    let name = unsafe { CStr::from_ptr(c.backend.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "generated");
    assert_eq!(c.size as usize, std::mem::size_of::<AttnforgeFwdContext>());
}

#[test]
fn bwd_workspace_size_is_the_chosen_backends() {
    let p = problem();
    let mut n = usize::MAX;
    // SAFETY: valid struct and out-pointer.
    let rc = unsafe { attnforge_bwd_workspace_size(&p, &mut n) };
    assert_eq!(rc, ATTNFORGE_OK, "{}", last_error());
    use crate::dispatch::Backend as _;
    let gen = crate::dispatch::GeneratedBackend::global();
    // SAFETY: valid struct.
    let (rust, _, _) = unsafe { read_problem(&p) }.ok().unwrap();
    assert_eq!(n, gen.workspace_bytes(crate::spec::Direction::Bwd, &rust));
    // Dsum (2·16·1000 f32) and the f32 dQ accumulator (2·1000·16·128 f32).
    assert_eq!(n, 4 * 2 * 16 * 1000 + 4 * 2 * 1000 * 16 * 128);
    let det = AttnforgeProblem {
        flags: ATTNFORGE_FLAG_REQUIRES_GRAD | ATTNFORGE_FLAG_DETERMINISTIC,
        ..problem()
    };
    // SAFETY: as above.
    assert_eq!(unsafe { attnforge_bwd_workspace_size(&det, &mut n) }, ATTNFORGE_OK);
    assert_eq!(n, 4 * 2 * 16 * 1000);
    // SAFETY: NULL out-pointer is reported.
    let rc = unsafe { attnforge_bwd_workspace_size(&p, std::ptr::null_mut()) };
    assert_eq!(rc, ATTNFORGE_ERR_INVALID_ARGUMENT);
    let drop = AttnforgeProblem {
        dropout_p: 0.1,
        ..problem()
    };
    // SAFETY: as above.
    let rc = unsafe { attnforge_bwd_workspace_size(&drop, &mut n) };
    assert_eq!(rc, ATTNFORGE_ERR_NO_BACKEND);
    assert!(last_error().contains("dropout"), "{}", last_error());
}

#[test]
fn bwd_refuses_before_compiling_or_touching_the_driver() {
    let p = problem();
    let kv = |ptr: usize| AttnforgeTensor {
        stride_batch: 1000 * 4 * 128,
        stride_seq: 4 * 128,
        ..tensor(ptr)
    };
    let (q, k, v, o, d_o) = (
        tensor(0x10000),
        kv(0x20000),
        kv(0x30000),
        tensor(0x40000),
        tensor(0x50000),
    );
    let (dq, dk, dv) = (tensor(0x60000), kv(0x70000), kv(0x80000));
    let mut n = 0;
    // SAFETY: valid struct and out-pointer.
    assert_eq!(unsafe { attnforge_bwd_workspace_size(&p, &mut n) }, ATTNFORGE_OK);
    let run = |dk: &AttnforgeTensor, ws: usize, bytes: usize| {
        // SAFETY: no device memory is touched: every call below is refused
        // at the argument check.
        unsafe {
            attnforge_bwd(
                &p,
                &q,
                &k,
                &v,
                &o,
                &d_o,
                &dq,
                dk,
                &dv,
                0x90000 as *const f32,
                ws as *mut c_void,
                bytes,
                std::ptr::null_mut(),
            )
        }
    };
    let bad_dk = AttnforgeTensor {
        ptr: 0x70004 as *mut c_void,
        ..dk
    };
    assert_eq!(run(&bad_dk, 0x100_0000, n), ATTNFORGE_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("`dk`"), "{}", last_error());
    assert_eq!(run(&dk, 0x100_0000, n - 1), ATTNFORGE_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("workspace"), "{}", last_error());
    assert_eq!(run(&dk, 0, n), ATTNFORGE_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("workspace"), "{}", last_error());
    // SAFETY: refused before any pointer is read.
    let rc = unsafe {
        attnforge_bwd(
            &p,
            &q,
            &k,
            &v,
            &o,
            std::ptr::null(),
            &dq,
            &dk,
            &dv,
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, ATTNFORGE_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "tensor d_o is NULL");
}
