//! How many cubes to launch for a one-dimensional job.

use cubecl::prelude::*;

/// Units per cube for element-wise kernels.
pub(crate) const UNITS: u32 = 256;

/// The most cubes one grid dimension may have on every backend we target
/// (WebGPU's `maxComputeWorkgroupsPerDimension`).
const MAX_CUBES_PER_DIM: u32 = 65_535;

/// A grid covering `units` units with [`UNITS`] per cube; beyond 65 535 cubes
/// the grid grows a second dimension, so kernels index with [`linear_pos`].
pub(crate) fn grid_1d(units: usize) -> (CubeCount, CubeDim) {
    let cubes = units.div_ceil(UNITS as usize).max(1) as u32;
    let count = if cubes <= MAX_CUBES_PER_DIM {
        CubeCount::Static(cubes, 1, 1)
    } else {
        CubeCount::Static(MAX_CUBES_PER_DIM, cubes.div_ceil(MAX_CUBES_PER_DIM), 1)
    };
    (count, CubeDim::new_1d(UNITS))
}

/// The unit's index in a grid made by [`grid_1d`].
#[cube]
pub(crate) fn linear_pos() -> usize {
    ((CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) * CUBE_DIM_X + UNIT_POS_X) as usize
}
