//! NVRTC and ptxas from a CUDA toolkit directory (the PyPI wheels
//! `nvidia-cuda-nvrtc`, `nvidia-cuda-nvcc`, `nvidia-cuda-runtime` and
//! `nvidia-cuda-cccl` unpack into one): CUDA C++ to PTX as `cubecl-cuda`
//! does at run time, then PTX to machine code with the resource report.
//! Neither needs a GPU or a driver. The reports can be kept in a directory
//! ([`CACHE_VAR`]), as ccache keeps objects: a kernel whose source, target
//! and toolkit are unchanged is not compiled again.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::gpu::Gpu;

/// The variable naming the toolkit directory: the one holding `bin/ptxas`,
/// `lib/libnvrtc.so.*` and `include/cuda_fp16.h`.
pub const TOOLKIT_VAR: &str = "CLEAVE_CUDA_TOOLKIT";

/// The variable naming a directory for ptxas's reports, each kept with the
/// source, target and toolkit versions it came from (unset: none kept).
pub const CACHE_VAR: &str = "CLEAVE_CUDA_CACHE";

pub struct Toolkit {
    root: PathBuf,
    nvrtc: libloading::Library,
    /// NVRTC's and ptxas's versions: part of what a kept report is for.
    versions: String,
    cache: Option<PathBuf>,
}

/// What ptxas reports of one kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resources {
    pub registers: u32,
    /// Shared memory declared in the kernel (cubecl's is dynamic, asked for
    /// at launch, so this is usually 0).
    pub static_shared_bytes: usize,
    pub stack_bytes: usize,
    pub spill_store_bytes: usize,
    pub spill_load_bytes: usize,
}

type Program = *mut c_void;

impl Toolkit {
    /// The toolkit named by [`TOOLKIT_VAR`], or what is missing and how to
    /// get it.
    pub fn from_env() -> Result<Toolkit, String> {
        let how = format!(
            "`pip install --target DIR nvidia-cuda-nvrtc nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl`, \
             then {TOOLKIT_VAR}=DIR/nvidia/cu13 (.ci/run does this)"
        );
        let root = std::env::var_os(TOOLKIT_VAR)
            .map(PathBuf::from)
            .ok_or_else(|| format!("{TOOLKIT_VAR} is not set; {how}"))?;
        for needed in ["bin/ptxas", "include/cuda_fp16.h"] {
            if !root.join(needed).is_file() {
                return Err(format!("{} has no {needed}; {how}", root.display()));
            }
        }
        let library =
            nvrtc_library(&root).ok_or_else(|| format!("{} has no lib/libnvrtc.so*; {how}", root.display()))?;
        // SAFETY: loading NVRTC runs its initialisers only, which have no
        // preconditions.
        let nvrtc =
            unsafe { libloading::Library::new(&library) }.map_err(|e| format!("loading {}: {e}", library.display()))?;
        let ptxas = Command::new(root.join("bin/ptxas"))
            .arg("--version")
            .output()
            .map_err(|e| format!("running ptxas: {e}"))?;
        let cache = std::env::var_os(CACHE_VAR).map(PathBuf::from);
        if let Some(dir) = &cache {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {} ({CACHE_VAR}): {e}", dir.display()))?;
        }
        let versions = format!(
            "NVRTC {}\n{}",
            nvrtc_version(&nvrtc),
            String::from_utf8_lossy(&ptxas.stdout)
        );
        Ok(Toolkit {
            root,
            nvrtc,
            versions,
            cache,
        })
    }

    /// What ptxas reports of `source` compiled for `gpu` (NVRTC's log or
    /// ptxas's output when either fails), from the cache when it holds the
    /// report of this source, target and toolkit.
    pub fn resources(&self, source: &str, gpu: Gpu, scratch: &Path) -> Result<Resources, String> {
        let kept = self
            .cache
            .as_deref()
            .map(|dir| KeptReport::new(dir, &self.versions, source, gpu));
        if let Some(used) = kept
            .as_ref()
            .and_then(KeptReport::read)
            .as_deref()
            .and_then(parse_resources)
        {
            return Ok(used);
        }
        let ptx = self
            .compile(source, gpu)
            .map_err(|log| format!("NVRTC failed:\n{log}"))?;
        let report = self
            .assemble(&ptx, gpu, scratch)
            .map_err(|out| format!("ptxas failed:\n{out}"))?;
        let used =
            parse_resources(&report).ok_or_else(|| format!("no resource report in ptxas's output:\n{report}"))?;
        if let Some(kept) = kept {
            kept.write(&report)?;
        }
        Ok(used)
    }

    /// NVRTC's version, as `major.minor`.
    pub fn nvrtc_version(&self) -> String {
        nvrtc_version(&self.nvrtc)
    }

    /// `source` compiled to PTX for `gpu` with the options `cubecl-cuda`
    /// passes NVRTC, or NVRTC's log.
    pub fn compile(&self, source: &str, gpu: Gpu) -> Result<String, String> {
        let include = self.root.join("include");
        let mut options = vec![
            format!("--gpu-architecture={}", gpu.target()),
            format!("--include-path={}", include.display()),
            "-lineinfo".to_string(),
        ];
        if include.join("cccl").exists() {
            options.push(format!("--include-path={}", include.join("cccl").display()));
        }
        let source = CString::new(source).map_err(|_| "the source holds a NUL byte".to_string())?;
        let options: Vec<CString> = options.into_iter().map(|o| CString::new(o).unwrap()).collect();
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: the NVRTC calls follow its documented protocol: create a
        // program from a NUL-terminated source, compile it with
        // NUL-terminated options that outlive the call, read the log and the
        // PTX into buffers of the sizes NVRTC gave, then destroy it.
        unsafe {
            let create: libloading::Symbol<
                unsafe extern "C" fn(
                    *mut Program,
                    *const c_char,
                    *const c_char,
                    c_int,
                    *const *const c_char,
                    *const *const c_char,
                ) -> c_int,
            > = self.nvrtc.get(b"nvrtcCreateProgram").map_err(|e| e.to_string())?;
            let compile: libloading::Symbol<unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int> =
                self.nvrtc.get(b"nvrtcCompileProgram").map_err(|e| e.to_string())?;
            let destroy: libloading::Symbol<unsafe extern "C" fn(*mut Program) -> c_int> =
                self.nvrtc.get(b"nvrtcDestroyProgram").map_err(|e| e.to_string())?;
            let mut program: Program = std::ptr::null_mut();
            let created = create(
                &mut program,
                source.as_ptr(),
                c"kernel.cu".as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if created != 0 {
                return Err(format!("nvrtcCreateProgram returned {created}"));
            }
            let status = compile(program, option_ptrs.len() as c_int, option_ptrs.as_ptr());
            let result = match status {
                0 => self.text(program, b"nvrtcGetPTXSize", b"nvrtcGetPTX"),
                _ => Err(self.text(program, b"nvrtcGetProgramLogSize", b"nvrtcGetProgramLog")?),
            };
            destroy(&mut program);
            result
        }
    }

    /// One of NVRTC's outputs (the log or the PTX) of `program`.
    unsafe fn text(&self, program: Program, size_fn: &[u8], get_fn: &[u8]) -> Result<String, String> {
        // SAFETY: as in `compile`; the buffer has the size NVRTC reported.
        unsafe {
            let size_of: libloading::Symbol<unsafe extern "C" fn(Program, *mut usize) -> c_int> =
                self.nvrtc.get(size_fn).map_err(|e| e.to_string())?;
            let get: libloading::Symbol<unsafe extern "C" fn(Program, *mut c_char) -> c_int> =
                self.nvrtc.get(get_fn).map_err(|e| e.to_string())?;
            let mut size = 0usize;
            size_of(program, &mut size);
            let mut buffer = vec![0u8; size.max(1)];
            get(program, buffer.as_mut_ptr().cast());
            let text = CStr::from_bytes_until_nul(&buffer).map_err(|e| e.to_string())?;
            Ok(text.to_string_lossy().into_owned())
        }
    }

    /// `ptx` assembled for `gpu` by ptxas, and its report of the one entry
    /// point's resources, or its output.
    fn assemble(&self, ptx: &str, gpu: Gpu, scratch: &Path) -> Result<String, String> {
        let input = scratch.with_extension("ptx");
        std::fs::write(&input, ptx).map_err(|e| format!("writing {}: {e}", input.display()))?;
        let output = Command::new(self.root.join("bin/ptxas"))
            .arg(format!("-arch={}", gpu.target()))
            .arg("-v")
            .arg(&input)
            .arg("-o")
            .arg(scratch.with_extension("cubin"))
            .output()
            .map_err(|e| format!("running ptxas: {e}"))?;
        let report = String::from_utf8_lossy(&output.stderr).into_owned();
        match output.status.success() {
            true => Ok(report),
            false => Err(report),
        }
    }
}

/// A report kept in the cache: a file named by a hash of what it is for,
/// holding that in full, so that a hash shared by two kernels only misses.
struct KeptReport {
    path: PathBuf,
    key: String,
}

impl KeptReport {
    fn new(dir: &Path, versions: &str, source: &str, gpu: Gpu) -> KeptReport {
        let key = format!("{versions}\n{}\n{source}\n\0", gpu.target());
        let mut hasher = std::hash::DefaultHasher::new();
        key.hash(&mut hasher);
        let path = dir.join(format!("{:016x}.txt", hasher.finish()));
        KeptReport { path, key }
    }

    fn read(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        text.strip_prefix(&self.key).map(str::to_owned)
    }

    /// Written whole under another name and then renamed, so that a reader
    /// never sees half a report.
    fn write(&self, report: &str) -> Result<(), String> {
        let partial = self.path.with_extension(format!("{}.partial", std::process::id()));
        std::fs::write(&partial, format!("{}{report}", self.key))
            .and_then(|()| std::fs::rename(&partial, &self.path))
            .map_err(|e| format!("keeping the report in {}: {e}", self.path.display()))
    }
}

/// The version of the NVRTC library `nvrtc`, as `major.minor`.
fn nvrtc_version(nvrtc: &libloading::Library) -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    unsafe {
        let version: libloading::Symbol<unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int> =
            nvrtc.get(b"nvrtcVersion").expect("nvrtcVersion");
        version(&mut major, &mut minor);
    }
    format!("{major}.{minor}")
}

/// `lib/libnvrtc.so*` under `root`, not the builtins library beside it.
fn nvrtc_library(root: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("lib"))
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc.so"))
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

/// The numbers of `ptxas -v`'s report:
/// `Used 32 registers, used 1 barriers, 128 bytes smem` and
/// `0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads`.
fn parse_resources(report: &str) -> Option<Resources> {
    let number_before = |unit: &str| -> Option<usize> {
        let at = report.find(unit)?;
        report[..at].split_whitespace().last()?.parse().ok()
    };
    Some(Resources {
        registers: number_before(" registers")? as u32,
        static_shared_bytes: number_before(" bytes smem").unwrap_or(0),
        stack_bytes: number_before(" bytes stack frame")?,
        spill_store_bytes: number_before(" bytes spill stores")?,
        spill_load_bytes: number_before(" bytes spill loads")?,
    })
}

#[test]
fn ptxas_reports_are_read() {
    let report = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                  ptxas info    : Function properties for k\n    \
                  16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
                  ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem, 380 bytes cmem[0]\n";
    let resources = parse_resources(report).unwrap();
    assert_eq!(
        resources,
        Resources {
            registers: 40,
            static_shared_bytes: 128,
            stack_bytes: 16,
            spill_store_bytes: 8,
            spill_load_bytes: 4
        }
    );
}

/// A kept report is read back for its own source, target and toolkit only,
/// even from a file of the same name.
#[test]
fn a_kept_report_is_read_back_for_its_own_kernel_only() {
    let dir = tempfile::tempdir().unwrap();
    let (sm80, sm90) = (Gpu::of_arch(80), Gpu::of_arch(90));
    let kept = KeptReport::new(dir.path(), "NVRTC 13.5", "kernel a", sm80);
    assert_eq!(kept.read(), None);
    kept.write("Used 40 registers").unwrap();
    assert_eq!(kept.read().as_deref(), Some("Used 40 registers"));
    for other in [
        KeptReport::new(dir.path(), "NVRTC 13.5", "kernel b", sm80),
        KeptReport::new(dir.path(), "NVRTC 13.5", "kernel a", sm90),
        KeptReport::new(dir.path(), "NVRTC 13.6", "kernel a", sm80),
    ] {
        assert_eq!(other.read(), None);
        let impostor = KeptReport {
            path: kept.path.clone(),
            key: other.key,
        };
        assert_eq!(impostor.read(), None);
    }
}
