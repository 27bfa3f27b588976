//! Which plan a module gets where the user leaves the choice open, as
//! llama.cpp's `llama_params_fit` decides it: layer split unless a mode (or
//! an expert cache) is asked for; layer split again where the module cannot
//! be split as asked; and for a mixture of experts that layer split would
//! stream block by block (or cannot place), expert split, which moves only
//! the routed experts.

use crate::{plan, plan_layers, Inventory, Member, Plan, PlanError, PlanOptions, Residency, SplitMode, Streaming};

/// What the user asked of a placement; `None` where they left it open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitRequest {
    pub mode: Option<SplitMode>,
    /// Row split: weights with fewer rows or columns stay whole.
    pub row_split_min: usize,
    /// What may stream, as asked (`stream_blocks` set is a choice of what
    /// to stream, `Residency::Auto` leaves it to the planner).
    pub streaming: Streaming,
}

impl FitRequest {
    /// The mode the fit tries first: the one asked for, else expert split
    /// where an expert cache is asked for, else layer split.
    pub fn first_mode(&self) -> SplitMode {
        match (self.mode, self.streaming.expert_cache) {
            (Some(mode), _) => mode,
            (None, Some(_)) => SplitMode::Expert,
            (None, None) => SplitMode::Layer,
        }
    }
}

/// A fitted plan, and what the fit chose that the user did not ask for,
/// one sentence each, for them to be told.
#[derive(Debug, PartialEq)]
pub struct Fitted {
    pub plan: Plan,
    pub chosen: Vec<String>,
}

/// The plan of `inventory` on `members` (split by `ratios` where given) for
/// `request`. `left_free` says what the budgets leave free beside the
/// plan (the fit target, a library's workspace): it joins the plan's notes,
/// and a module that does not fit is told it, as what a smaller fit target
/// lessens.
pub fn fit(
    inventory: &Inventory,
    members: &[Member],
    ratios: Option<&[f64]>,
    request: &FitRequest,
    left_free: &[String],
) -> Result<Fitted, PlanError> {
    let options = PlanOptions {
        mode: request.first_mode(),
        row_split_min: request.row_split_min,
        streaming: request.streaming,
    };
    let mut chosen = Vec::new();
    let planned = match plan(inventory, members, ratios, &options) {
        Err(e @ PlanError::Unsupported { .. }) => {
            chosen.push(format!("{e}; using layer split"));
            plan_layers(inventory, members, ratios, options.streaming)
        }
        other => other,
    };
    let short_of_memory = match &planned {
        Ok(plan) => plan.devices.iter().any(|d| !d.streamed.is_empty()),
        Err(e) => matches!(e, PlanError::DoesNotFit { .. }),
    };
    let left_open = request.mode.is_none()
        && request.streaming.stream_blocks.is_none()
        && request.streaming.residency == Residency::Auto;
    let has_experts = inventory.geometry.as_ref().is_some_and(|g| g.experts > 0);
    if short_of_memory && left_open && has_experts {
        let experts = PlanOptions {
            mode: SplitMode::Expert,
            ..options
        };
        if let Ok(mut plan) = plan(inventory, members, ratios, &experts) {
            chosen.push(format!(
                "{}: the devices cannot hold every expert; caching the routed ones instead of streaming whole \
                 blocks (--split-mode layer streams blocks)",
                inventory.module
            ));
            plan.notes.extend_from_slice(left_free);
            return Ok(Fitted { plan, chosen });
        }
    }
    let mut plan = planned.map_err(|e| match e {
        PlanError::DoesNotFit { module, reason } if !left_free.is_empty() => {
            let left = left_free.join("; ");
            let reason = format!("{reason}; {left}, which a smaller --fit-target lessens");
            PlanError::DoesNotFit { module, reason }
        }
        e => e,
    })?;
    plan.notes.extend_from_slice(left_free);
    Ok(Fitted { plan, chosen })
}
