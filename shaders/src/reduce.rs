//! Tree reductions across the x-dimension of a cube, in shared memory.
//!
//! Each row of units along y owns `partial[base..base + CUBE_DIM_X]`; after
//! the call `partial[base]` holds the row's result, visible to every unit.

use cubecl::prelude::*;

#[cube]
pub(crate) fn reduce_sum<F: Float>(partial: &mut SharedMemory<F>, base: u32) {
    let lane = UNIT_POS_X;
    let mut stride = CUBE_DIM_X / 2;
    while stride > 0 {
        if lane < stride {
            let other = partial[(base + lane + stride) as usize];
            partial[(base + lane) as usize] += other;
        }
        sync_cube();
        stride /= 2;
    }
}

#[cube]
pub(crate) fn reduce_max<F: Float>(partial: &mut SharedMemory<F>, base: u32) {
    let lane = UNIT_POS_X;
    let mut stride = CUBE_DIM_X / 2;
    while stride > 0 {
        if lane < stride {
            let other = partial[(base + lane + stride) as usize];
            let mine = partial[(base + lane) as usize];
            partial[(base + lane) as usize] = F::max(mine, other);
        }
        sync_cube();
        stride /= 2;
    }
}
