//! A cubecl runtime that compiles kernels to CUDA C++ and keeps the source
//! instead of running it, so the CUDA code of every launch can be checked on
//! a machine with no GPU and no driver.
//!
//! Kernels go through the same launch functions as on a device, are defined
//! with the device and target properties `cubecl-cuda` gives a GPU of the
//! chosen architecture, and are compiled by `cubecl-cuda`'s compiler with
//! the options it would use there. Buffers have handles but no memory: the
//! server never runs a kernel, so nothing is ever read or written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use cubecl::cuda::{CudaCompiler, CudaRuntime};
use cubecl::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle};
use cubecl::future::DynFut;
use cubecl::ir::{
    features::{AtomicUsage, Plane, TypeUsage},
    BarrierLevel, DeviceProperties, ElemType, FloatKind, HardwareProperties, MemoryDeviceProperties, OpaqueType,
    SemanticType, StorageType, TargetProperties, Type, VectorSize,
};
use cubecl::prelude::*;
use cubecl::profile::{ProfileDuration, TimingMethod};
use cubecl::server::{
    Binding, ComputeServer, CopyDescriptor, KernelArguments, ProfileError, ProfilingToken, ServerCommunication,
    ServerError, ServerUtilities,
};
use cubecl::stream_id::StreamId;
use cubecl::zspace::{Shape, Strides};
use cubecl::{backtrace::BackTrace, bytes::Bytes, CubeTask, MemoryAllocationMode, MemoryUsage};
use cubecl_cpp::cuda::arch::CudaArchitecture;
use cubecl_cpp::cuda::mma::CudaWmmaCompiler;
use cubecl_cpp::cuda::CudaDialect;
use cubecl_cpp::shared::{
    register_mma_features, register_scaled_mma_features, register_wmma_features, CompilationOptions,
    CppSupportedFeatures,
};
use cubecl_cpp::{register_supported_types, DialectWmmaCompiler};
use cubecl_runtime::allocator::ContiguousMemoryLayoutPolicy;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::ManagedMemoryHandle;
use cubecl_runtime::server::TensorMapMeta;
use cubecl_runtime::storage::{BytesStorage, ComputeStorage, ManagedResource};
use cubecl_runtime::tma::{TensorMapFormat, TensorMapInterleave, TensorMapSwizzle, TiledArgs};

use super::gpu::Gpu;

/// One kernel as `cubecl-cuda` would hand it to NVRTC.
#[derive(Clone, Debug)]
pub struct CudaKernel {
    /// The entry point, with its element-type suffix (`gemv_f32`).
    pub name: String,
    /// cubecl's full name of the kernel type, comptime arguments included.
    pub variant: String,
    pub source: String,
    pub units_per_cube: u32,
    /// Dynamic shared memory the launch asks for, in bytes.
    pub shared_bytes: usize,
}

/// What the launches on one architecture produced: kernels, or the
/// compiler's refusal.
#[derive(Default)]
struct Launched {
    kernels: Vec<CudaKernel>,
    errors: Vec<String>,
}

/// What each architecture's launches produced, by compute capability.
static LAUNCHED: Mutex<BTreeMap<u32, Launched>> = Mutex::new(BTreeMap::new());

/// The kernels launched so far on `client` (made by [`client`] for `gpu`),
/// each kernel and variant once, as first launched, and the compile
/// errors, emptied.
///
/// One variant is one kernel: the real runtime compiles it once and caches
/// it by this id. Its source is not a key: cubecl-ir's allocator keeps a
/// kernel's local variables in a hash map by type, so each compile may
/// declare them in another order, and keeping each such copy checked some
/// kernels twice and left the table with whichever copy came last.
pub fn take_launched(client: &ComputeClient<CudaSource>, gpu: Gpu) -> (Vec<CudaKernel>, Vec<String>) {
    // Launches reach the server through a queue: wait until it is empty.
    cubecl::future::block_on(client.sync()).expect("the CUDA source server never fails to sync");
    let Launched { kernels, errors } = LAUNCHED.lock().unwrap().remove(&gpu.arch).unwrap_or_default();
    let mut seen = BTreeSet::new();
    let unique = kernels
        .into_iter()
        .filter(|k| seen.insert((k.name.clone(), k.variant.clone())))
        .collect();
    (unique, errors)
}

fn record(arch: u32, outcome: Result<CudaKernel, String>) {
    let mut all = LAUNCHED.lock().unwrap();
    let launched = all.entry(arch).or_default();
    match outcome {
        Ok(kernel) => launched.kernels.push(kernel),
        Err(error) => launched.errors.push(error),
    }
}

/// Why `cubecl-cuda` would refuse the box of a tiled tensor map (what one
/// tensor-memory copy moves), as its launch checks it before the driver
/// encodes the map: each dimension 1 to 256 elements, the innermost within
/// the swizzle's span. A GPU refuses it only when the kernel is launched on
/// the device thread, after the launch call has returned `Ok`, and every
/// later read of the device fails: a caller cannot fall back, so the check
/// refuses it here.
fn refused_box(map: &TensorMapMeta) -> Option<String> {
    let TensorMapFormat::Tiled(TiledArgs { tile_size }) = &map.format else {
        return None;
    };
    if tile_size.iter().any(|&d| d == 0 || d > 256) {
        return Some(format!(
            "a tensor map's box {:?} has a dimension of 0 or over 256 elements",
            &tile_size[..]
        ));
    }
    let span = match map.swizzle {
        TensorMapSwizzle::None => return None,
        TensorMapSwizzle::B32 => 32,
        TensorMapSwizzle::B64 => 64,
        _ => 128,
    };
    let innermost = tile_size.last().copied().unwrap_or(0) * map.storage_ty.size();
    (map.interleave == TensorMapInterleave::None && innermost > span).then(|| {
        format!(
            "a tensor map's box {:?} has an innermost row of {innermost} bytes, over its swizzle's {span}",
            &tile_size[..]
        )
    })
}

/// The runtime: `cubecl-cuda`'s compiler and target, this file's server.
#[derive(Debug, Clone)]
pub struct CudaSource;

/// A device of this runtime is an architecture (its id's index is the
/// compute capability, 80 or 90).
#[derive(Debug, Clone, Default)]
pub struct SourceDevice(pub u32);

impl Device for SourceDevice {
    fn from_id(id: DeviceId) -> Self {
        SourceDevice(id.index_id as u32)
    }

    fn to_id(&self) -> DeviceId {
        DeviceId {
            type_id: 0,
            index_id: self.0 as u16,
        }
    }
}

/// A client whose launches compile for `gpu` and are kept.
pub fn client(gpu: Gpu) -> ComputeClient<CudaSource> {
    ComputeClient::load(&SourceDevice(gpu.arch))
}

impl Runtime for CudaSource {
    type Compiler = CudaCompiler;
    type Server = SourceServer;
    type Device = SourceDevice;

    fn client(device: &Self::Device) -> ComputeClient<Self> {
        ComputeClient::load(device)
    }

    fn name(_client: &ComputeClient<Self>) -> &'static str {
        "cuda"
    }

    fn require_array_lengths() -> bool {
        CudaRuntime::require_array_lengths()
    }

    fn max_cube_count() -> (u32, u32, u32) {
        CudaRuntime::max_cube_count()
    }

    fn can_read_tensor(shape: &Shape, strides: &Strides) -> bool {
        CudaRuntime::can_read_tensor(shape, strides)
    }

    fn target_properties() -> TargetProperties {
        CudaRuntime::target_properties()
    }

    fn enumerate_devices(_type_id: u16, _info: &()) -> Vec<DeviceId> {
        Vec::new()
    }
}

#[derive(Debug)]
pub struct SourceServer {
    gpu: Gpu,
    options: CompilationOptions,
    utilities: Arc<ServerUtilities<Self>>,
}

impl DeviceService for SourceServer {
    fn init(device_id: DeviceId) -> Self {
        let gpu = Gpu::of_arch(device_id.index_id as u32);
        let (properties, options) = cuda_properties(gpu);
        let policy = ContiguousMemoryLayoutPolicy::new(properties.memory.alignment as usize);
        let utilities = ServerUtilities::new(properties, Arc::new(ServerLogger::default()), (), policy);
        SourceServer {
            gpu,
            options,
            utilities: Arc::new(utilities),
        }
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        self.utilities.clone() as ServerUtilitiesHandle
    }
}

/// The device properties and compilation options `cubecl-cuda` derives
/// from a device of `gpu`'s architecture and limits (its `DeviceService`
/// for `CudaServer`), less what only matters to matrix-core kernels'
/// memory layout.
fn cuda_properties(gpu: Gpu) -> (DeviceProperties, CompilationOptions) {
    let arch = CudaArchitecture { version: gpu.arch };
    type Wmma = CudaWmmaCompiler;
    let wmma = <Wmma as DialectWmmaCompiler<CudaDialect<Wmma>>>::supported_wmma_combinations(&arch);
    let mma = <Wmma as DialectWmmaCompiler<CudaDialect<Wmma>>>::supported_mma_combinations(&arch);
    let scaled = <Wmma as DialectWmmaCompiler<CudaDialect<Wmma>>>::supported_scaled_mma_combinations(&arch);
    let mut options = CompilationOptions {
        warp_size: 32,
        supports_features: CppSupportedFeatures {
            fast_math: true,
            ..Default::default()
        },
    };
    let hardware = HardwareProperties {
        load_width: 128,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: cubecl::cuda::CUDA_MAX_BINDINGS,
        max_shared_memory_size: gpu.max_shared_bytes,
        max_cube_count: (i32::MAX as u32, u16::MAX as u32, u16::MAX as u32),
        max_units_per_cube: gpu.max_units_per_cube,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(gpu.multiprocessors),
        num_tensor_cores: Some(4),
        min_tensor_cores_dim: (!wmma.is_empty()).then_some(8),
        num_cpu_cores: None,
        max_vector_size: VectorSize::MAX,
    };
    let memory = MemoryDeviceProperties {
        max_page_size: gpu.memory_bytes / 4,
        alignment: 512,
    };
    let mut props = DeviceProperties::new(Default::default(), memory, hardware, TimingMethod::System);
    register_supported_types(&mut props);
    props.register_type_usage(ElemType::Float(FloatKind::TF32), TypeUsage::Conversion);
    let atomic = |kind| Type::new(StorageType::Atomic(ElemType::Float(kind)));
    props.register_atomic_type_usage(atomic(FloatKind::F64), AtomicUsage::Add | AtomicUsage::LoadStore);
    props.register_atomic_type_usage(atomic(FloatKind::F16), AtomicUsage::Add | AtomicUsage::LoadStore);
    props.register_atomic_type_usage(
        atomic(FloatKind::F16).with_vector_size(2),
        AtomicUsage::Add | AtomicUsage::LoadStore,
    );
    props.register_semantic_type(SemanticType::Pipeline);
    props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Unit), TypeUsage::Buffer);
    props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Cube), TypeUsage::Buffer);
    props.features.plane.insert(Plane::Sync);
    options.supports_features.grid_constants = true;
    for half in [FloatKind::F16, FloatKind::BF16] {
        props.features.matmul.ldmatrix.insert(ElemType::Float(half).into());
    }
    options.supports_features.fast_tanh = cudarc::driver::sys::CUDA_VERSION >= 12080;
    props.features.copy_async = true;
    if gpu.arch >= 89 {
        for fp8 in [FloatKind::E4M3, FloatKind::E5M2] {
            props.register_type_usage(ElemType::Float(fp8), TypeUsage::Conversion | TypeUsage::Buffer);
        }
    }
    if gpu.arch >= 90 {
        props.features.tma.insert(cubecl::ir::features::Tma::Base);
        props.register_semantic_type(SemanticType::TensorMap);
        props.features.cube_cluster = true;
        options.supports_features.clusters = true;
        options.supports_features.elect_sync = true;
        for half in [FloatKind::F16, FloatKind::BF16] {
            props.features.matmul.stmatrix.insert(ElemType::Float(half).into());
        }
        for lanes in [2, 4] {
            props.register_atomic_type_usage(
                atomic(FloatKind::F32).with_vector_size(lanes),
                AtomicUsage::LoadStore | AtomicUsage::Add,
            );
        }
    }
    props.features.memory_reinterpret = true;
    props.features.alignment = true;
    props.features.plane.insert(Plane::Ops);
    props.features.plane.insert(Plane::NonUniformControlFlow);
    register_wmma_features(wmma, &mut props);
    register_mma_features(mma, &mut props);
    register_scaled_mma_features(scaled, &mut props);
    (props, options)
}

impl ComputeServer for SourceServer {
    type Kernel = Box<dyn CubeTask<CudaCompiler>>;
    type Info = ();
    type MemoryLayoutPolicy = ContiguousMemoryLayoutPolicy;
    type Storage = BytesStorage;

    fn initialize_memory(&mut self, _memory: ManagedMemoryHandle, _size: u64, _stream_id: StreamId) {}

    fn logger(&self) -> Arc<ServerLogger> {
        self.utilities.logger.clone()
    }

    fn utilities(&self) -> Arc<ServerUtilities<Self>> {
        self.utilities.clone()
    }

    fn read(
        &mut self,
        _descriptors: Vec<CopyDescriptor>,
        _stream_id: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        Box::pin(async { Err(no_memory("read")) })
    }

    fn write(&mut self, _descriptors: Vec<(CopyDescriptor, Bytes)>, _stream_id: StreamId) {}

    fn sync(&mut self, _stream_id: StreamId) -> DynFut<Result<(), ServerError>> {
        Box::pin(async { Ok(()) })
    }

    fn get_resource(
        &mut self,
        _binding: Binding,
        _stream_id: StreamId,
    ) -> Result<ManagedResource<<Self::Storage as ComputeStorage>::Resource>, ServerError> {
        Err(no_memory("get_resource"))
    }

    unsafe fn launch(
        &mut self,
        kernel: Self::Kernel,
        _count: CubeCount,
        bindings: KernelArguments,
        mode: ExecutionMode,
        _stream_id: StreamId,
    ) {
        let variant = format!("{}", kernel.id());
        if let Some(problem) = bindings.tensor_maps.iter().find_map(|b| refused_box(&b.map)) {
            record(self.gpu.arch, Err(format!("{variant}: {problem}")));
            return;
        }
        let compiled = kernel.compile(&mut Default::default(), &self.options, mode, kernel.address_type());
        let outcome = match compiled {
            Ok(compiled) => Ok(CudaKernel {
                name: compiled.entrypoint_name,
                variant,
                source: compiled.source,
                units_per_cube: compiled.cube_dim.num_elems(),
                shared_bytes: compiled.repr.map_or(0, |repr| repr.shared_memory_size()),
            }),
            Err(error) => Err(format!("{variant}: cubecl's CUDA compiler: {error}")),
        };
        record(self.gpu.arch, outcome);
    }

    fn flush(&mut self, _stream_id: StreamId) -> Result<(), ServerError> {
        Ok(())
    }

    fn memory_usage(&mut self, _stream_id: StreamId) -> Result<MemoryUsage, ServerError> {
        Err(no_memory("memory_usage"))
    }

    fn memory_cleanup(&mut self, _stream_id: StreamId) {}

    fn start_profile(&mut self, _stream_id: StreamId) -> Result<ProfilingToken, ServerError> {
        Err(no_memory("start_profile"))
    }

    fn end_profile(&mut self, _stream_id: StreamId, _token: ProfilingToken) -> Result<ProfileDuration, ProfileError> {
        Err(ProfileError::Unknown {
            reason: "kernels are compiled, never run".into(),
            backtrace: BackTrace::capture(),
        })
    }

    fn allocation_mode(&mut self, _mode: MemoryAllocationMode, _stream_id: StreamId) {}
}

impl ServerCommunication for SourceServer {
    const SERVER_COMM_ENABLED: bool = false;
}

fn no_memory(what: &str) -> ServerError {
    ServerError::Generic {
        reason: format!("{what}: the CUDA source runtime compiles kernels and holds no memory"),
        backtrace: BackTrace::capture(),
    }
}
