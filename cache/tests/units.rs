//! Keys, sizes and configuration.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;

use attnforge_cache::{format_size, parse_size, CacheConfig, CacheError, CacheKey, KeyBuilder};

#[test]
fn key_fields_are_length_prefixed() {
    let a = KeyBuilder::new().field("ab", "c").finish();
    let b = KeyBuilder::new().field("a", "bc").finish();
    let c = KeyBuilder::new().field("a", "b").field("", "c").finish();
    let d = KeyBuilder::new().field("a", "").field("b", "c").finish();
    let all = [a, b, c, d];
    for (i, x) in all.iter().enumerate() {
        for y in &all[i + 1..] {
            assert_ne!(x, y);
        }
    }
}

#[test]
fn key_is_deterministic_and_order_sensitive() {
    let k1 = KeyBuilder::new().field("spec", "s").field("arch", "sm_80").finish();
    let k2 = KeyBuilder::new().field("spec", "s").field("arch", "sm_80").finish();
    let k3 = KeyBuilder::new().field("arch", "sm_80").field("spec", "s").finish();
    assert_eq!(k1, k2);
    assert_ne!(k1, k3);
    assert_ne!(KeyBuilder::new().finish(), k1);
}

#[test]
fn key_hex_round_trip() {
    let k = KeyBuilder::new().field("x", [1u8, 2, 3]).finish();
    let s = k.to_string();
    assert_eq!(s.len(), 64);
    assert!(s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert_eq!(s.parse::<CacheKey>().expect("parse"), k);
    assert_eq!(k.to_hex(), s);
    assert_eq!(k.shard(), s[..2]);
    let json = serde_json::to_string(&k).expect("serialize");
    assert_eq!(json, format!("\"{s}\""));
    assert_eq!(serde_json::from_str::<CacheKey>(&json).expect("deserialize"), k);
}

#[test]
fn key_parse_errors() {
    for bad in ["", "abc", &"g".repeat(64), &"A".repeat(64), &"0".repeat(65)] {
        let err = bad.parse::<CacheKey>().expect_err(bad);
        assert!(matches!(err, CacheError::InvalidKey { .. }), "{err}");
        assert!(err.to_string().contains("invalid cache key"), "{err}");
    }
}

#[test]
fn parse_size_accepts_common_forms() {
    let cases: &[(&str, u64)] = &[
        ("1024", 1024),
        ("0", 0),
        ("10k", 10 * 1024),
        ("10K", 10 * 1024),
        ("10KiB", 10 * 1024),
        ("10kb", 10 * 1024),
        ("500M", 500 << 20),
        ("500 MB", 500 << 20),
        ("2G", 2 << 30),
        ("2gib", 2 << 30),
        ("1.5GiB", 3 << 29),
        ("0.5k", 512),
        (".5k", 512),
        ("1.", 1),
        ("1T", 1 << 40),
        ("  7b ", 7),
        ("1.0000000001", 1),
        ("18446744073709551615", u64::MAX),
    ];
    for (input, want) in cases {
        assert_eq!(
            parse_size(input).unwrap_or_else(|e| panic!("{input}: {e}")),
            *want,
            "{input}"
        );
    }
}

#[test]
fn parse_size_rejects_garbage() {
    for bad in [
        "",
        "  ",
        "M",
        "-1",
        "1x",
        "1 MiBs",
        "1e3",
        "inf",
        "nan",
        "1.2.3",
        ".",
        "1,5G",
        "18446744073709551616",
        "99999999999T",
        "1.0000000000000000001",
    ] {
        let err = parse_size(bad).expect_err(bad);
        assert!(matches!(err, CacheError::InvalidSize { .. }), "{bad}: {err}");
        let msg = err.to_string();
        assert!(msg.contains("invalid size") && msg.contains("500M"), "{msg}");
    }
}

#[test]
fn format_size_is_readable() {
    assert_eq!(format_size(0), "0 B");
    assert_eq!(format_size(1023), "1023 B");
    assert_eq!(format_size(1536), "1.5 KiB");
    assert_eq!(format_size(3 << 29), "1.5 GiB");
}

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
    move |name| map.get(name).cloned()
}

#[test]
fn config_from_env_precedence() {
    let cfg = CacheConfig::from_vars(vars(&[
        ("ATTNFORGE_CACHE_PATH", "/opt/a::/opt/b:"),
        ("ATTNFORGE_CACHE_DIR", "/c"),
        ("XDG_CACHE_HOME", "/x"),
        ("HOME", "/h"),
    ]));
    assert_eq!(
        cfg.read_only_roots,
        vec![PathBuf::from("/opt/a"), PathBuf::from("/opt/b")]
    );
    assert_eq!(cfg.user_root, Some(PathBuf::from("/c")));

    let cfg = CacheConfig::from_vars(vars(&[
        ("ATTNFORGE_CACHE_DIR", ""),
        ("XDG_CACHE_HOME", "/x"),
        ("HOME", "/h"),
    ]));
    assert!(cfg.read_only_roots.is_empty());
    assert_eq!(cfg.user_root, Some(PathBuf::from("/x/attnforge")));

    // A relative XDG_CACHE_HOME is ignored, as the XDG spec requires.
    let cfg = CacheConfig::from_vars(vars(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]));
    assert_eq!(cfg.user_root, Some(PathBuf::from("/h/.cache/attnforge")));

    let cfg = CacheConfig::from_vars(vars(&[("ATTNFORGE_CACHE_PATH", "")]));
    assert_eq!(cfg, CacheConfig::default());
}
