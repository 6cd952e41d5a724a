//! User policy: which backends to use, in which order, per direction.
//!
//! By API ([`Policy::with_fwd`], [`Policy::with_bwd`],
//! `Dispatcher::set_policy`) or by environment:
//!
//! | variable                | value                                   | effect |
//! |-------------------------|-----------------------------------------|--------|
//! | `ATTNFORGE_BACKEND_FWD` | `generated` or `torch-flash,torch-cudnn` | only these, in this order, for the forward |
//! | `ATTNFORGE_BACKEND_BWD` | same                                    | same for the backward |
//! | `ATTNFORGE_DEBUG`       | `1`                                      | log each decision once per distinct problem to stderr |
//! | `ATTNFORGE_GENERATED_PATH` | `planner` (default) or `sm80`         | `sm80`: the generated backend runs the sm80 instruction path (`fwd_sm80.cu`, `bwd_sm80.cu`) where the planner takes the wgmma templates (Hopper): for comparing the paths, or to avoid a template |
//!
//! Empty, `auto` or `default` means no policy (the default ranking).
//! Reading the environment is the only I/O here, and it happens once, at the
//! edge ([`Policy::from_env`]); [`Policy::from_vars`] is the pure core.

use std::fmt;

use crate::spec::Direction;

pub const ENV_BACKEND_FWD: &str = "ATTNFORGE_BACKEND_FWD";
pub const ENV_BACKEND_BWD: &str = "ATTNFORGE_BACKEND_BWD";
pub const ENV_DEBUG: &str = "ATTNFORGE_DEBUG";
pub const ENV_GENERATED_PATH: &str = "ATTNFORGE_GENERATED_PATH";

/// Which instruction path the generated backend's kernels take.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GeneratedPath {
    /// The planner's template for the device (wgmma on Hopper).
    #[default]
    Planner,
    /// The sm80 instruction path (`mma.sync`, `cp.async`) on every arch
    /// ([`crate::plan::Variant::Sm80Path`]).
    Sm80,
    /// A value that names neither: the generated backend declines every
    /// problem and says why (never a silent fallback).
    Invalid(String),
}

impl GeneratedPath {
    /// `planner`, `auto`, `default` or empty; `sm80`; anything else is kept
    /// as [`GeneratedPath::Invalid`].
    pub fn parse(text: &str) -> GeneratedPath {
        match text.trim().to_ascii_lowercase().as_str() {
            "" | "auto" | "default" | "planner" => GeneratedPath::Planner,
            "sm80" => GeneratedPath::Sm80,
            _ => GeneratedPath::Invalid(text.trim().to_string()),
        }
    }
}

impl fmt::Display for GeneratedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GeneratedPath::Planner => f.write_str("planner"),
            GeneratedPath::Sm80 => f.write_str("sm80"),
            GeneratedPath::Invalid(v) => write!(f, "`{v}` (invalid)"),
        }
    }
}

/// An ordered list of backend names and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyList {
    pub names: Vec<String>,
    /// `ATTNFORGE_BACKEND_FWD`, `ATTNFORGE_BACKEND_BWD` or `policy` (API).
    pub origin: String,
}

impl PolicyList {
    /// Parse a comma list; `None` for empty / `auto` / `default`.
    pub fn parse(text: &str, origin: &str) -> Option<PolicyList> {
        let mut names: Vec<String> = Vec::new();
        for n in text
            .split(',')
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
        {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        if names.is_empty() || (names.len() == 1 && matches!(names[0].as_str(), "auto" | "default")) {
            return None;
        }
        Some(PolicyList {
            names,
            origin: origin.to_string(),
        })
    }

    pub fn position(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }
}

impl fmt::Display for PolicyList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names.join(","))
    }
}

/// Backend preferences per direction, and the debug switch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    pub fwd: Option<PolicyList>,
    pub bwd: Option<PolicyList>,
    /// Log each decision once per distinct problem.
    pub debug: bool,
    /// The generated backend's instruction path.
    pub generated_path: GeneratedPath,
}

impl Policy {
    /// No preferences: the default ranking.
    pub fn auto() -> Policy {
        Policy::default()
    }

    /// From the process environment (see the module table).
    pub fn from_env() -> Policy {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From any variable source (pure; for tests and embedding).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Policy {
        let list = |var: &str| get(var).and_then(|v| PolicyList::parse(&v, var));
        let debug = get(ENV_DEBUG)
            .map(|v| {
                !matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "" | "0" | "false" | "off" | "no"
                )
            })
            .unwrap_or(false);
        Policy {
            fwd: list(ENV_BACKEND_FWD),
            bwd: list(ENV_BACKEND_BWD),
            debug,
            generated_path: get(ENV_GENERATED_PATH).map_or(GeneratedPath::Planner, |v| GeneratedPath::parse(&v)),
        }
    }

    /// Only these forward backends, in this order (`auto` clears).
    pub fn with_fwd(mut self, names: &str) -> Policy {
        self.fwd = PolicyList::parse(names, "policy");
        self
    }

    /// Only these backward backends, in this order (`auto` clears).
    pub fn with_bwd(mut self, names: &str) -> Policy {
        self.bwd = PolicyList::parse(names, "policy");
        self
    }

    pub fn with_debug(mut self, on: bool) -> Policy {
        self.debug = on;
        self
    }

    /// The generated backend's instruction path (see [`GeneratedPath::parse`]).
    pub fn with_generated_path(mut self, path: GeneratedPath) -> Policy {
        self.generated_path = path;
        self
    }

    pub fn for_direction(&self, d: Direction) -> Option<&PolicyList> {
        match d {
            Direction::Fwd => self.fwd.as_ref(),
            Direction::Bwd => self.bwd.as_ref(),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |l: &Option<PolicyList>| l.as_ref().map_or("auto".to_string(), |l| format!("{l} ({})", l.origin));
        write!(f, "fwd={} bwd={}", show(&self.fwd), show(&self.bwd))?;
        if self.generated_path != GeneratedPath::Planner {
            write!(f, " generated-path={}", self.generated_path)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn env_lists_parse_in_order() {
        let p = Policy::from_vars(vars(&[
            ("ATTNFORGE_BACKEND_FWD", "generated"),
            ("ATTNFORGE_BACKEND_BWD", " Torch-Flash, torch-cudnn ,,torch-flash"),
            ("ATTNFORGE_DEBUG", "1"),
        ]));
        assert_eq!(p.fwd.as_ref().unwrap().names, vec!["generated"]);
        assert_eq!(p.fwd.as_ref().unwrap().origin, "ATTNFORGE_BACKEND_FWD");
        assert_eq!(p.bwd.as_ref().unwrap().names, vec!["torch-flash", "torch-cudnn"]);
        assert!(p.debug);
        assert_eq!(p.bwd.unwrap().position("torch-cudnn"), Some(1));
    }

    #[test]
    fn empty_auto_and_unset_mean_no_policy() {
        for v in ["", " , ", "auto", "DEFAULT"] {
            let p = Policy::from_vars(vars(&[("ATTNFORGE_BACKEND_FWD", v), ("ATTNFORGE_DEBUG", "0")]));
            assert_eq!(p, Policy::auto(), "{v:?}");
        }
        assert_eq!(Policy::from_vars(|_| None), Policy::auto());
        assert!(Policy::from_vars(vars(&[("ATTNFORGE_DEBUG", "yes")])).debug);
        assert!(!Policy::from_vars(vars(&[("ATTNFORGE_DEBUG", "off")])).debug);
    }

    #[test]
    fn api_builds_the_same_lists() {
        let p = Policy::auto().with_fwd("torch-flash").with_bwd("auto");
        assert_eq!(p.fwd.as_ref().unwrap().names, vec!["torch-flash"]);
        assert_eq!(p.fwd.as_ref().unwrap().origin, "policy");
        assert!(p.bwd.is_none());
        assert_eq!(p.to_string(), "fwd=torch-flash (policy) bwd=auto");
    }

    #[test]
    fn the_generated_path_parses_and_shows_only_when_not_the_planner() {
        for (v, want) in [
            ("", GeneratedPath::Planner),
            ("Planner", GeneratedPath::Planner),
            ("auto", GeneratedPath::Planner),
            (" SM80 ", GeneratedPath::Sm80),
            ("sm90", GeneratedPath::Invalid("sm90".into())),
        ] {
            let p = Policy::from_vars(vars(&[("ATTNFORGE_GENERATED_PATH", v)]));
            assert_eq!(p.generated_path, want, "{v:?}");
        }
        assert_eq!(Policy::auto().generated_path, GeneratedPath::Planner);
        let p = Policy::auto().with_generated_path(GeneratedPath::Sm80);
        assert_eq!(p.to_string(), "fwd=auto bwd=auto generated-path=sm80");
        assert_eq!(Policy::auto().to_string(), "fwd=auto bwd=auto");
    }
}
