//! Snapshots of plans for a table of cases, and of what the fit chooses
//! where the user leaves it open. Each snapshot is the plan as `cleave
//! plan` prints it, or the error.

use cleave_plan::{
    fit, plan, plan_layers, BlockGeometry, BlockShard, FitRequest, Fitted, Inventory, Matmul, Member, PlanOptions,
    Residency, Role, SplitMode, Streaming,
};

/// Every block on a device, or an error.
const RESIDENT: Streaming = Streaming {
    residency: Residency::Device,
    stream_blocks: None,
    expert_cache: None,
};

const MIB: u64 = 1 << 20;

/// A Llama-like module: `blocks` blocks of 10 MiB, 1 MiB of KV cache each.
fn llm(blocks: usize) -> Inventory {
    Inventory {
        module: "llm".into(),
        head_bytes: 8 * MIB,
        block_bytes: vec![10 * MIB; blocks],
        tail_bytes: 8 * MIB,
        tail_shared_with_head: 0,
        cache_bytes: vec![MIB; blocks],
        compute_bytes: 2 * MIB,
        geometry: None,
    }
}

/// A real Llama-shaped block (hidden 512, 8 heads of 64, 2 KV heads,
/// intermediate 1376) for row and tensor split.
fn llama(blocks: usize, kv_heads: usize) -> Inventory {
    let (h, heads, head_dim, i) = (512, 8, 64, 1376);
    let matmul = |name: &str, role, rows, cols: usize| Matmul {
        name: name.into(),
        role,
        rows,
        cols,
        bias: false,
        row_bytes_over_blocks: (blocks * cols * 4) as u64,
        block_len: 1,
    };
    let matmuls = vec![
        matmul("self_attn.q_proj", Role::Query, heads * head_dim, h),
        matmul("self_attn.k_proj", Role::Key, kv_heads * head_dim, h),
        matmul("self_attn.v_proj", Role::Value, kv_heads * head_dim, h),
        matmul("self_attn.o_proj", Role::Output, h, heads * head_dim),
        matmul("mlp.gate_proj", Role::Gate, i, h),
        matmul("mlp.up_proj", Role::Up, i, h),
        matmul("mlp.down_proj", Role::Down, h, i),
    ];
    let block: u64 = matmuls.iter().map(|m| (m.rows * m.cols * 4) as u64).sum::<u64>() + 2 * 512 * 4;
    Inventory {
        module: "llm".into(),
        head_bytes: 32000 * 512 * 4,
        block_bytes: vec![block; blocks],
        tail_bytes: 32000 * 512 * 4 + 512 * 4,
        tail_shared_with_head: 0,
        cache_bytes: vec![(2 * 1024 * kv_heads * head_dim * 4) as u64; blocks],
        compute_bytes: 8 * MIB,
        geometry: Some(BlockGeometry {
            heads,
            kv_heads,
            head_dim,
            intermediate: i,
            matmuls,
            per_head_shard_bytes: 0,
            experts: 0,
            linear_blocks: 0,
            uneven_blocks: 0,
            expert_bytes_over_blocks: 0,
        }),
    }
}

fn show_mode(
    inventory: &Inventory,
    budgets: &[Option<u64>],
    ratios: Option<&[f64]>,
    mode: SplitMode,
    min: usize,
) -> String {
    let options = PlanOptions {
        mode,
        row_split_min: min,
        streaming: RESIDENT,
    };
    match plan(inventory, &members(budgets), ratios, &options) {
        Ok(plan) => plan.to_string(),
        Err(e) => format!("error: {e}\n"),
    }
}

fn members(budgets: &[Option<u64>]) -> Vec<Member> {
    budgets
        .iter()
        .enumerate()
        .map(|(i, b)| Member {
            name: format!("vulkan{i}"),
            budget: b.map(|mib| mib * MIB),
            runtime: None,
        })
        .collect()
}

fn show(inventory: &Inventory, budgets: &[Option<u64>], ratios: Option<&[f64]>) -> String {
    match plan_layers(inventory, &members(budgets), ratios, RESIDENT) {
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
    let plan = plan_layers(&llm(3), &members(&[Some(100), Some(100)]), None, RESIDENT).unwrap();
    insta::assert_snapshot!(serde_json::to_string_pretty(&plan).unwrap());
}

#[test]
fn row_split_two_devices() {
    insta::assert_snapshot!(show_mode(&llama(4, 2), &[None, None], None, SplitMode::Row, 256));
}

#[test]
fn row_split_uneven_ratios_keeps_small_weights_whole() {
    // k_proj and v_proj have 128 rows, under --row-split-min 256.
    insta::assert_snapshot!(show_mode(
        &llama(4, 2),
        &[None, None, None],
        Some(&[2.0, 1.0, 1.0]),
        SplitMode::Row,
        256
    ));
}

#[test]
fn tensor_split_three_devices_gqa() {
    // 2 KV heads over 3 devices: heads go by KV head, the MLP by columns.
    insta::assert_snapshot!(show_mode(
        &llama(4, 2),
        &[None, None, None],
        None,
        SplitMode::Tensor,
        256
    ));
}

#[test]
fn tensor_split_four_kv_heads_on_two_devices() {
    insta::assert_snapshot!(show_mode(
        &llama(4, 4),
        &[Some(1024), Some(1024)],
        None,
        SplitMode::Tensor,
        256
    ));
}

#[test]
fn tensor_split_does_not_fit() {
    insta::assert_snapshot!(show_mode(
        &llama(4, 2),
        &[Some(100), Some(100)],
        None,
        SplitMode::Tensor,
        256
    ));
}

/// Ratios are shares, whatever their scale: every split places
/// `1e308,1` as it places `1,0` (everything on the first device) and
/// `1e308,1e308` as `1,1`, however near infinity their sum or their share
/// of a count of blocks, rows or heads.
#[test]
fn ratios_near_the_largest_float_are_shares() {
    let same = [
        ([1e308, 1.0], [1.0, 0.0]),
        ([1e308, 0.0], [1.0, 0.0]),
        ([1e308, 1e308], [1.0, 1.0]),
    ];
    for mode in [SplitMode::Layer, SplitMode::Row, SplitMode::Tensor] {
        for (huge, small) in &same {
            let huge_plan = show_mode(&llama(4, 2), &[Some(1024), Some(1024)], Some(huge), mode, 256);
            let small_plan = show_mode(&llama(4, 2), &[Some(1024), Some(1024)], Some(small), mode, 256);
            assert!(!huge_plan.starts_with("error"), "{mode} {huge:?}: {huge_plan}");
            assert_eq!(huge_plan, small_plan, "{mode} {huge:?}");
        }
    }
    for (huge, small) in &same {
        let huge_plan = show_experts(&[None, None], Some(huge), RESIDENT);
        assert!(!huge_plan.starts_with("error"), "expert {huge:?}: {huge_plan}");
        assert_eq!(
            huge_plan,
            show_experts(&[None, None], Some(small), RESIDENT),
            "expert {huge:?}"
        );
    }
}

/// Ratios that are no ratios are refused by every split, naming the flag
/// and the values.
#[test]
fn ratios_that_are_not_ratios_are_refused() {
    let bad = [[0.0, 0.0], [f64::NAN, 1.0], [f64::INFINITY, 1.0], [-1.0, 2.0]];
    for mode in [SplitMode::Layer, SplitMode::Row, SplitMode::Tensor, SplitMode::Expert] {
        for ratios in &bad {
            let options = PlanOptions {
                mode,
                streaming: RESIDENT,
                ..PlanOptions::default()
            };
            let inventory = if mode == SplitMode::Expert { moe(4) } else { llama(4, 2) };
            let err = plan(&inventory, &members(&[None, None]), Some(ratios), &options).unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with("--tensor-split ratios") && text.contains(&format!("{ratios:?}")),
                "{mode} {ratios:?}: {text}"
            );
        }
    }
}

#[test]
fn modules_without_geometry_only_split_by_layers() {
    insta::assert_snapshot!(show_mode(&llm(4), &[None, None], None, SplitMode::Row, 256));
}

#[test]
fn row_split_plan_serializes_its_slices() {
    let options = PlanOptions {
        mode: SplitMode::Row,
        ..PlanOptions::default()
    };
    let plan = plan(&llama(2, 2), &members(&[None, None]), None, &options).unwrap();
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["mode"], "row");
    assert_eq!(json["devices"][1]["rows"][0]["tensor"], "self_attn.q_proj");
    assert_eq!(json["devices"][1]["rows"][0]["rows"], serde_json::json!([256, 512]));
}

fn show_streaming(inventory: &Inventory, budgets: &[Option<u64>], streaming: Streaming) -> String {
    match plan_layers(inventory, &members(budgets), None, streaming) {
        Ok(plan) => plan.to_string(),
        Err(e) => format!("error: {e}\n"),
    }
}

#[test]
fn auto_residency_streams_what_does_not_fit() {
    // 8 blocks of 10 MiB on two 40 MiB devices: each keeps what it can.
    insta::assert_snapshot!(show_streaming(&llm(8), &[Some(40), Some(40)], Streaming::default()));
}

#[test]
fn auto_residency_streams_nothing_when_it_fits() {
    insta::assert_snapshot!(show_streaming(&llm(8), &[Some(1024), Some(1024)], Streaming::default()));
}

#[test]
fn device_residency_refuses_to_stream() {
    insta::assert_snapshot!(show_streaming(&llm(8), &[Some(40), Some(40)], RESIDENT));
}

#[test]
fn explicit_stream_layers() {
    let streaming = Streaming {
        residency: Residency::Host,
        stream_blocks: Some(3),
        expert_cache: None,
    };
    insta::assert_snapshot!(show_streaming(&llm(8), &[None, None], streaming));
}

#[test]
fn disk_residency_streams_every_block() {
    let streaming = Streaming {
        residency: Residency::Disk,
        stream_blocks: None,
        expert_cache: None,
    };
    insta::assert_snapshot!(show_streaming(&llm(4), &[None], streaming));
}

/// Streaming that the plan would not do is refused, never dropped.
#[test]
fn streaming_the_plan_would_not_do_is_refused() {
    let streaming = |residency, stream_blocks| Streaming {
        residency,
        stream_blocks,
        expert_cache: None,
    };
    let cases = [
        (
            SplitMode::Layer,
            streaming(Residency::Device, Some(2)),
            "--residency device refuses",
        ),
        (SplitMode::Row, streaming(Residency::Auto, Some(2)), "not row split"),
        (SplitMode::Tensor, streaming(Residency::Host, None), "not tensor split"),
        (SplitMode::Row, streaming(Residency::Disk, None), "not row split"),
    ];
    for (mode, streaming, reason) in cases {
        let options = PlanOptions {
            mode,
            streaming,
            ..PlanOptions::default()
        };
        let err = plan(&llama(2, 2), &members(&[None, None]), None, &options).unwrap_err();
        assert!(err.to_string().contains(reason), "{mode}: {err}");
    }
}

#[test]
fn too_small_even_to_stream() {
    // Not even the KV cache, compute buffers and one block fit.
    insta::assert_snapshot!(show_streaming(&llm(8), &[Some(12), Some(12)], Streaming::default()));
}

/// A mixture of experts: `blocks` blocks of the `llama` block's attention,
/// a router, and 8 experts of hidden 512 and intermediate 1024 in f32
/// (6 MiB each, 24 MiB over 4 blocks).
fn moe(blocks: usize) -> Inventory {
    let (h, i, experts) = (512u64, 1024u64, 8);
    let expert = 3 * h * i * 4;
    let dense = llama(blocks, 2);
    let mut geometry = dense.geometry.clone().unwrap();
    geometry.experts = experts;
    geometry.expert_bytes_over_blocks = expert * blocks as u64;
    let attention: u64 = geometry.matmuls[..4].iter().map(|m| (m.rows * m.cols * 4) as u64).sum();
    let block = attention + 2 * h * 4 + experts as u64 * h * 4 + experts as u64 * expert;
    Inventory {
        block_bytes: vec![block; blocks],
        geometry: Some(geometry),
        ..dense
    }
}

fn show_experts(budgets: &[Option<u64>], ratios: Option<&[f64]>, streaming: Streaming) -> String {
    let options = PlanOptions {
        mode: SplitMode::Expert,
        row_split_min: 256,
        streaming,
    };
    match plan(&moe(4), &members(budgets), ratios, &options) {
        Ok(plan) => {
            // Every expert is owned by exactly one device, in order.
            let owned: Vec<usize> = plan
                .devices
                .iter()
                .flat_map(|d| d.experts.clone().unwrap().experts)
                .collect();
            assert_eq!(owned, (0..8).collect::<Vec<_>>());
            plan.to_string()
        }
        Err(e) => format!("error: {e}\n"),
    }
}

const CACHE_OF_TWO: Streaming = Streaming {
    residency: Residency::Auto,
    stream_blocks: None,
    expert_cache: Some(2),
};

#[test]
fn expert_split_two_devices_unknown_memory() {
    insta::assert_snapshot!(show_experts(&[None, None], None, RESIDENT));
}

#[test]
fn expert_split_three_devices_by_memory() {
    // The main device holds the embeddings, attention and KV cache: it
    // takes fewer experts than its budget alone would say.
    insta::assert_snapshot!(show_experts(&[Some(400), Some(300), Some(300)], None, RESIDENT));
}

#[test]
fn expert_split_user_ratios() {
    insta::assert_snapshot!(show_experts(&[None, None], Some(&[1.0, 3.0]), RESIDENT));
}

#[test]
fn expert_split_caches_what_does_not_fit() {
    // 24 MiB an expert over every block: each device has room for 2 of
    // its 4.
    insta::assert_snapshot!(show_experts(&[Some(200), Some(60)], None, Streaming::default()));
}

#[test]
fn expert_split_device_residency_does_not_fit() {
    insta::assert_snapshot!(show_experts(&[Some(200), Some(60)], None, RESIDENT));
}

#[test]
fn expert_cache_of_two_per_block() {
    insta::assert_snapshot!(show_experts(&[None, None], None, CACHE_OF_TWO));
}

#[test]
fn expert_split_refuses_what_it_cannot_do() {
    let expert = |inventory: &Inventory, streaming: Streaming| {
        let options = PlanOptions {
            mode: SplitMode::Expert,
            row_split_min: 256,
            streaming,
        };
        plan(inventory, &members(&[None, None]), None, &options)
            .unwrap_err()
            .to_string()
    };
    let dense = expert(&llama(4, 2), RESIDENT);
    assert!(dense.contains("expert") && dense.contains("no experts"), "{dense}");
    let stream_layers = expert(
        &moe(4),
        Streaming {
            stream_blocks: Some(1),
            ..RESIDENT
        },
    );
    assert!(stream_layers.contains("--stream-layers"), "{stream_layers}");
    let device_cache = expert(
        &moe(4),
        Streaming {
            residency: Residency::Device,
            ..CACHE_OF_TWO
        },
    );
    assert!(
        device_cache.contains("--expert-cache") && device_cache.contains("--residency device"),
        "{device_cache}"
    );
    let layer = PlanOptions {
        streaming: CACHE_OF_TWO,
        ..PlanOptions::default()
    };
    let layer_cache = plan(&moe(4), &members(&[None]), None, &layer).unwrap_err().to_string();
    assert!(
        layer_cache.contains("--expert-cache") && layer_cache.contains("layer split"),
        "{layer_cache}"
    );
}

#[test]
fn expert_split_plan_serializes_its_experts() {
    let options = PlanOptions {
        mode: SplitMode::Expert,
        streaming: CACHE_OF_TWO,
        ..PlanOptions::default()
    };
    let plan = plan(&moe(2), &members(&[None, None]), None, &options).unwrap();
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["mode"], "expert");
    assert_eq!(
        json["devices"][1]["experts"],
        serde_json::json!({"experts": [4, 8], "cached": 2})
    );
}

/// The shards a block runs as: one on the block's device, holding all of
/// it, in layer and row split; in tensor split one per device with heads
/// or MLP columns, the heads and columns covered once, in order.
#[test]
fn block_shards_follow_the_split() {
    let inventory = llama(4, 2);
    let options = |mode| PlanOptions {
        mode,
        row_split_min: 256,
        streaming: RESIDENT,
    };
    let budgets = members(&[None, None]);
    let layer = plan(&inventory, &budgets, None, &options(SplitMode::Layer)).unwrap();
    for block in 0..4 {
        let shards = layer.block_shards(block);
        assert_eq!(shards.len(), 1);
        assert_eq!(shards[0].device, layer.device_of_block(block));
        assert_eq!(shards[0].slice, None);
    }
    let row = plan(&inventory, &budgets, None, &options(SplitMode::Row)).unwrap();
    assert_eq!(row.block_shards(3), [BlockShard { device: 0, slice: None }]);
    let tensor = plan(&inventory, &budgets, None, &options(SplitMode::Tensor)).unwrap();
    let shards = tensor.block_shards(3);
    assert_eq!(shards.iter().map(|s| s.device).collect::<Vec<_>>(), [0, 1]);
    let slices: Vec<_> = shards.iter().map(|s| s.slice.clone().unwrap()).collect();
    assert_eq!((slices[0].heads.start, slices[1].heads.end), (0, 8));
    assert_eq!(slices[0].heads.end, slices[1].heads.start);
    assert_eq!((slices[0].kv_heads.start, slices[1].kv_heads.end), (0, 2));
    assert_eq!((slices[0].intermediate.start, slices[1].intermediate.end), (0, 1376));
    assert_eq!(slices[0].intermediate.end, slices[1].intermediate.start);
}

/// The request that leaves every choice to the fit.
const LEFT_OPEN: FitRequest = FitRequest {
    mode: None,
    row_split_min: 256,
    streaming: Streaming {
        residency: Residency::Auto,
        stream_blocks: None,
        expert_cache: None,
    },
};

/// `fit`'s plan as `cleave plan` prints it, after what the fit chose, or
/// the error.
fn show_fit(inventory: &Inventory, budgets: &[Option<u64>], request: FitRequest, left_free: &[String]) -> String {
    match fit(inventory, &members(budgets), None, &request, left_free) {
        Ok(Fitted { plan, chosen }) => {
            let chosen: String = chosen.iter().map(|c| format!("chosen: {c}\n")).collect();
            chosen + &plan.to_string()
        }
        Err(e) => format!("error: {e}\n"),
    }
}

#[test]
fn fit_takes_layer_split_where_nothing_is_asked() {
    insta::assert_snapshot!(show_fit(&llm(8), &[Some(1024), Some(1024)], LEFT_OPEN, &[]));
}

#[test]
fn fit_takes_expert_split_for_an_expert_cache() {
    let request = FitRequest {
        streaming: CACHE_OF_TWO,
        ..LEFT_OPEN
    };
    insta::assert_snapshot!(show_fit(&moe(4), &[None, None], request, &[]));
}

#[test]
fn fit_takes_layer_split_where_the_asked_mode_cannot_split() {
    let request = FitRequest {
        mode: Some(SplitMode::Expert),
        ..LEFT_OPEN
    };
    insta::assert_snapshot!(show_fit(&llm(4), &[None, None], request, &[]));
}

#[test]
fn fit_caches_experts_where_layer_split_would_stream_blocks() {
    insta::assert_snapshot!(show_fit(&moe(4), &[Some(200), Some(60)], LEFT_OPEN, &[]));
}

#[test]
fn fit_keeps_an_asked_layer_split_that_streams_blocks() {
    let request = FitRequest {
        mode: Some(SplitMode::Layer),
        ..LEFT_OPEN
    };
    insta::assert_snapshot!(show_fit(&moe(4), &[Some(200), Some(60)], request, &[]));
}

#[test]
fn fit_says_what_is_left_free_with_the_plan_and_where_nothing_fits() {
    let left_free = ["left free on vulkan0, vulkan1: 1.0 GiB (--fit-target)".to_string()];
    let resident = FitRequest {
        streaming: RESIDENT,
        ..LEFT_OPEN
    };
    let fits = show_fit(&llm(8), &[Some(1024), Some(1024)], resident, &left_free);
    let does_not = show_fit(&llm(8), &[Some(30), Some(30)], resident, &left_free);
    insta::assert_snapshot!(format!("{fits}\n{does_not}"));
}
