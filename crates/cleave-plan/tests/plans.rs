//! Snapshots of layer-split plans for a table of cases. Each snapshot is
//! the plan as `cleave plan` prints it, or the error.

use cleave_plan::{plan_layers, Inventory, Member};

const MIB: u64 = 1 << 20;

/// A Llama-like module: `blocks` blocks of 10 MiB, 1 MiB of KV cache each.
fn llm(blocks: usize) -> Inventory {
    Inventory {
        module: "llm".into(),
        head_bytes: 8 * MIB,
        block_bytes: vec![10 * MIB; blocks],
        tail_bytes: 8 * MIB,
        tail_shared_with_head: 0,
        kv_bytes_per_block: MIB,
        compute_bytes: 2 * MIB,
    }
}

fn members(budgets: &[Option<u64>]) -> Vec<Member> {
    budgets
        .iter()
        .enumerate()
        .map(|(i, b)| Member {
            name: format!("vulkan{i}"),
            budget: b.map(|mib| mib * MIB),
        })
        .collect()
}

fn show(inventory: &Inventory, budgets: &[Option<u64>], ratios: Option<&[f64]>) -> String {
    match plan_layers(inventory, &members(budgets), ratios) {
        Ok(plan) => {
            // Every block is placed exactly once, in order.
            let placed: Vec<usize> = plan.devices.iter().flat_map(|d| d.blocks.clone()).collect();
            assert_eq!(placed, (0..inventory.block_bytes.len()).collect::<Vec<_>>());
            plan.to_string()
        }
        Err(e) => format!("error: {e}\n"),
    }
}

#[test]
fn one_device() {
    insta::assert_snapshot!(show(&llm(8), &[Some(1024)], None));
}

#[test]
fn two_equal_devices() {
    insta::assert_snapshot!(show(&llm(8), &[Some(1024), Some(1024)], None));
}

#[test]
fn three_devices_unknown_memory() {
    insta::assert_snapshot!(show(&llm(9), &[None, None, None], None));
}

#[test]
fn four_devices_odd_layer_count() {
    insta::assert_snapshot!(show(&llm(7), &[Some(512); 4], None));
}

#[test]
fn uneven_budgets() {
    insta::assert_snapshot!(show(&llm(12), &[Some(300), Some(100), Some(50)], None));
}

#[test]
fn user_ratios() {
    insta::assert_snapshot!(show(&llm(8), &[None, None], Some(&[3.0, 1.0])));
}

#[test]
fn ratios_that_do_not_fit() {
    insta::assert_snapshot!(show(&llm(8), &[Some(40), Some(1000)], Some(&[1.0, 1.0])));
}

#[test]
fn ratio_count_mismatch() {
    insta::assert_snapshot!(show(&llm(8), &[None, None], Some(&[1.0, 1.0, 1.0])));
}

#[test]
fn more_devices_than_blocks() {
    insta::assert_snapshot!(show(&llm(2), &[None, None, None, None], None));
}

#[test]
fn device_with_zero_budget() {
    insta::assert_snapshot!(show(&llm(6), &[Some(0), Some(200), Some(200)], None));
}

#[test]
fn small_first_device_hands_blocks_on() {
    // The head and compute buffers count against the first device.
    insta::assert_snapshot!(show(&llm(8), &[Some(40), Some(200), Some(200)], None));
}

#[test]
fn huge_vocab_head() {
    let mut inv = llm(8);
    inv.head_bytes = 500 * MIB;
    inv.tail_bytes = 500 * MIB;
    insta::assert_snapshot!(show(&inv, &[Some(800), Some(800)], None));
}

#[test]
fn tied_head_stored_once_on_one_device() {
    let mut inv = llm(4);
    inv.tail_bytes = 8 * MIB + 1024;
    inv.tail_shared_with_head = 8 * MIB;
    insta::assert_snapshot!(show(&inv, &[Some(1024)], None));
}

#[test]
fn does_not_fit() {
    insta::assert_snapshot!(show(&llm(8), &[Some(30), Some(30)], None));
}

#[test]
fn plan_serializes_as_json() {
    let plan = plan_layers(&llm(3), &members(&[Some(100), Some(100)]), None).unwrap();
    insta::assert_snapshot!(serde_json::to_string_pretty(&plan).unwrap());
}
