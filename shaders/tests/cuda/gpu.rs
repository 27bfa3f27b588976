//! The GPUs the kernels are checked for: one architecture each, with the
//! per-block limits its hardware enforces at launch.

#[derive(Clone, Copy, Debug)]
pub struct Gpu {
    /// Compute capability as `cubecl-cuda` writes it (80 for sm_80).
    pub arch: u32,
    /// The part whose limits these are.
    pub part: &'static str,
    /// Shared memory one block may use once the kernel opts in.
    pub max_shared_bytes: usize,
    pub max_units_per_cube: u32,
    /// The register file one block may take.
    pub registers_per_cube: u32,
    pub multiprocessors: u32,
    pub memory_bytes: u64,
}

/// Ampere (A100) and Hopper (H100): the GPUs of today's multi-GPU servers.
pub const GPUS: [Gpu; 2] = [
    Gpu {
        arch: 80,
        part: "A100",
        max_shared_bytes: 163 * 1024,
        max_units_per_cube: 1024,
        registers_per_cube: 65_536,
        multiprocessors: 108,
        memory_bytes: 80 << 30,
    },
    Gpu {
        arch: 90,
        part: "H100",
        max_shared_bytes: 227 * 1024,
        max_units_per_cube: 1024,
        registers_per_cube: 65_536,
        multiprocessors: 132,
        memory_bytes: 80 << 30,
    },
];

/// The most registers one thread may use on every architecture here.
pub const MAX_REGISTERS_PER_UNIT: u32 = 255;

impl Gpu {
    pub fn of_arch(arch: u32) -> Gpu {
        GPUS.into_iter()
            .find(|gpu| gpu.arch == arch)
            .unwrap_or_else(|| panic!("no limits known for sm_{arch}"))
    }

    /// The target as NVRTC and ptxas name it; from sm_90 on cubecl-cuda
    /// compiles for the architecture-specific variant (`sm_90a`).
    pub fn target(self) -> String {
        match self.arch >= 90 {
            true => format!("sm_{}a", self.arch),
            false => format!("sm_{}", self.arch),
        }
    }
}
