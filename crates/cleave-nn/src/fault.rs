//! A test hook that makes one logical device fail, so the tests can check
//! that a device failing mid-run ends in an error (a failed command, a 500
//! for that group's requests) and never in a hang. Nothing sets it but the
//! `CLEAVE_INJECT_FAULT` environment variable:
//!
//! `CLEAVE_INJECT_FAULT="group=G,device=D,alloc=N"` fails the N-th
//! allocation on member D of group G (the server's groups count from 0;
//! every other command has group 0), and `launch=N` fails the N-th block
//! that runs there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{ModelError, Result};

/// What fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    Alloc,
    Launch,
}

/// A fault armed on one device: the `at`-th event of its kind fails.
#[derive(Debug)]
pub struct Fault {
    kind: FaultKind,
    at: u64,
    seen: AtomicU64,
}

/// The environment variable that arms a fault.
pub const FAULT_VARIABLE: &str = "CLEAVE_INJECT_FAULT";

impl Fault {
    /// The fault `CLEAVE_INJECT_FAULT` arms on member `device` of the group
    /// named `group`, if any. A malformed value is an error, so a test
    /// cannot pass because its fault was never armed.
    pub fn from_env(group: &str, device: usize) -> Result<Option<Arc<Fault>>> {
        match std::env::var(FAULT_VARIABLE) {
            Ok(spec) => Self::parse(&spec, group, device),
            Err(_) => Ok(None),
        }
    }

    fn parse(spec: &str, group: &str, device: usize) -> Result<Option<Arc<Fault>>> {
        let bad = |why: &str| ModelError::Input(format!("{FAULT_VARIABLE}='{spec}': {why}"));
        let (mut on_group, mut on_device, mut armed) = (None, None, None);
        for part in spec.split(',') {
            let (key, value) = part.split_once('=').ok_or_else(|| bad("expected key=value pairs"))?;
            match key.trim() {
                "group" => on_group = Some(value.trim().to_string()),
                "device" => on_device = Some(value.trim().parse::<usize>().map_err(|_| bad("device is an index"))?),
                kind @ ("alloc" | "launch") => {
                    let at = value.trim().parse::<u64>().ok().filter(|&n| n > 0);
                    let kind = if kind == "alloc" {
                        FaultKind::Alloc
                    } else {
                        FaultKind::Launch
                    };
                    armed = Some((kind, at.ok_or_else(|| bad("a count from 1"))?));
                }
                other => return Err(bad(&format!("unknown key '{other}'"))),
            }
        }
        let (kind, at) = armed.ok_or_else(|| bad("say alloc=N or launch=N"))?;
        let here = on_group.as_deref().unwrap_or("0") == group && on_device.unwrap_or(0) == device;
        Ok(here.then(|| {
            Arc::new(Fault {
                kind,
                at,
                seen: AtomicU64::new(0),
            })
        }))
    }

    /// Counts an event of `kind` on `device`, failing at the armed one and
    /// every one after it (a failed device stays failed).
    pub fn check(&self, kind: FaultKind, device: &str) -> Result<()> {
        if kind != self.kind {
            return Ok(());
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.at {
            let what = match kind {
                FaultKind::Alloc => "allocation",
                FaultKind::Launch => "launch",
            };
            return Err(ModelError::Device(format!("{device}: {what} failed (injected fault)")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_arms_only_its_device_and_fails_from_its_count_on() {
        let spec = "group=1,device=2,launch=3";
        assert!(Fault::parse(spec, "0", 2).unwrap().is_none());
        assert!(Fault::parse(spec, "1", 0).unwrap().is_none());
        let fault = Fault::parse(spec, "1", 2).unwrap().unwrap();
        assert!(fault.check(FaultKind::Alloc, "d").is_ok());
        assert!(fault.check(FaultKind::Launch, "d").is_ok());
        assert!(fault.check(FaultKind::Launch, "d").is_ok());
        let err = fault.check(FaultKind::Launch, "d").unwrap_err().to_string();
        assert!(err.contains("d: launch failed (injected fault)"), "{err}");
        assert!(fault.check(FaultKind::Launch, "d").is_err());
    }

    #[test]
    fn a_malformed_spec_is_an_error() {
        for spec in ["launch", "launch=0", "device=x,alloc=1", "group=0", "boom=1"] {
            let err = Fault::parse(spec, "0", 0).unwrap_err().to_string();
            assert!(err.contains(FAULT_VARIABLE), "{spec}: {err}");
        }
    }
}
