//! How many cubes to launch for a one-dimensional job.

use cubecl::prelude::*;

/// Units per cube for element-wise kernels.
pub(crate) const UNITS: u32 = 256;

/// The most cubes one grid dimension may have on every backend we target
/// (WebGPU's `maxComputeWorkgroupsPerDimension`).
pub(crate) const MAX_CUBES_PER_DIM: u32 = 65_535;

/// A grid covering `units` units with [`UNITS`] per cube; kernels index
/// with [`linear_pos`].
pub(crate) fn grid_1d(units: usize) -> (CubeCount, CubeDim) {
    (cube_grid(units.div_ceil(UNITS as usize)), CubeDim::new_1d(UNITS))
}

/// At least `cubes` cubes (one at the least); beyond 65 535 the grid grows a
/// second dimension, so kernels number their cube with [`cube_index`] and
/// skip the few past `cubes`.
pub(crate) fn cube_grid(cubes: usize) -> CubeCount {
    let cubes = cubes.max(1) as u32;
    if cubes <= MAX_CUBES_PER_DIM {
        CubeCount::Static(cubes, 1, 1)
    } else {
        CubeCount::Static(MAX_CUBES_PER_DIM, cubes.div_ceil(MAX_CUBES_PER_DIM), 1)
    }
}

/// The cube's number in a grid made by [`cube_grid`].
#[cube]
pub(crate) fn cube_index() -> u32 {
    CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X
}

/// The unit's index in a grid made by [`grid_1d`].
#[cube]
pub(crate) fn linear_pos() -> usize {
    (cube_index() * CUBE_DIM_X + UNIT_POS_X) as usize
}
