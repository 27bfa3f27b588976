//! Device specs as users write them, after stable-diffusion.cpp:
//! `llm=cuda0&cuda1`, `diffusion=cuda0&cuda1,te=cuda1`, `vulkan0:64MiB`.
//!
//! `&` joins the devices of one module's group (the same name twice means
//! two logical devices on one adapter), `,` separates modules, and
//! `:SIZE` caps what the device may use. A spec without `module=` is the
//! `llm` module's.

use crate::bytes::parse_bytes;
use crate::DeviceError;

/// One device of a group, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSpec {
    pub device: String,
    pub cap: Option<u64>,
}

/// One module's group, as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleSpec {
    pub module: String,
    pub members: Vec<MemberSpec>,
}

/// The default module of a spec that names none.
pub const DEFAULT_MODULE: &str = "llm";

/// Parses a whole `--backend` value.
pub fn parse_backend_spec(spec: &str) -> Result<Vec<ModuleSpec>, DeviceError> {
    let malformed = |reason: String| DeviceError::Spec {
        spec: spec.to_string(),
        reason,
    };
    let mut modules: Vec<ModuleSpec> = Vec::new();
    for part in spec.split(',').map(str::trim) {
        // An empty entry would otherwise be the default module's, named
        // twice or with no device.
        if part.is_empty() {
            return Err(malformed(
                "the list has an empty entry: a ',' with no module or device on one side".into(),
            ));
        }
        let (module, devices) = match part.split_once('=') {
            Some((m, d)) => (m.trim(), d),
            None => (DEFAULT_MODULE, part),
        };
        if module.is_empty() || !module.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(malformed(format!("'{module}' is not a module name")));
        }
        if modules.iter().any(|m| m.module == module) {
            return Err(malformed(format!("module '{module}' is given twice")));
        }
        let members = devices
            .split('&')
            .map(|d| parse_member(d.trim()).map_err(&malformed))
            .collect::<Result<Vec<_>, _>>()?;
        modules.push(ModuleSpec {
            module: module.to_string(),
            members,
        });
    }
    Ok(modules)
}

fn parse_member(text: &str) -> Result<MemberSpec, String> {
    let (device, cap) = match text.split_once(':') {
        Some((d, c)) => {
            let cap = parse_bytes(c).ok_or_else(|| format!("'{c}' is not a size (e.g. 64MiB, 8GiB)"))?;
            (d, Some(cap))
        }
        None => (text, None),
    };
    let valid = device.len() > 1
        && device.starts_with(|c: char| c.is_ascii_alphabetic())
        && device.ends_with(|c: char| c.is_ascii_digit())
        && device.chars().all(|c| c.is_ascii_alphanumeric());
    if !valid {
        return Err(format!("'{text}' is not a device (e.g. cuda0, vulkan1, metal0)"));
    }
    Ok(MemberSpec {
        device: device.to_string(),
        cap,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(device: &str, cap: Option<u64>) -> MemberSpec {
        MemberSpec {
            device: device.into(),
            cap,
        }
    }

    #[test]
    fn one_module_several_devices() {
        let spec = parse_backend_spec("llm=cuda0&cuda1").unwrap();
        assert_eq!(spec.len(), 1);
        assert_eq!(spec[0].module, "llm");
        assert_eq!(spec[0].members, vec![member("cuda0", None), member("cuda1", None)]);
    }

    #[test]
    fn several_modules_and_caps() {
        let spec = parse_backend_spec("diffusion=cuda0&cuda1, te=vulkan0:64MiB").unwrap();
        assert_eq!(spec[0].module, "diffusion");
        assert_eq!(spec[1].module, "te");
        assert_eq!(spec[1].members, vec![member("vulkan0", Some(64 << 20))]);
    }

    #[test]
    fn bare_devices_are_the_llm() {
        let spec = parse_backend_spec("vulkan0&vulkan0").unwrap();
        assert_eq!(spec[0].module, "llm");
        assert_eq!(spec[0].members.len(), 2);
    }

    #[test]
    fn malformed_specs_say_why() {
        for (spec, why) in [
            ("llm=", "is not a device"),
            ("llm=cuda0&&cuda1", "is not a device"),
            ("llm=cuda0:lots", "is not a size"),
            ("=cuda0", "is not a module name"),
            ("llm=cuda0,llm=cuda1", "given twice"),
            ("llm=gpu", "is not a device"),
            ("vulkan0,", "an empty entry"),
            (",llm=vulkan0", "an empty entry"),
            ("te=vulkan0,,llm=vulkan1", "an empty entry"),
        ] {
            let err = parse_backend_spec(spec).unwrap_err().to_string();
            assert!(err.contains(why), "{spec}: {err}");
            assert!(err.contains(spec), "{spec}: {err}");
        }
    }
}
