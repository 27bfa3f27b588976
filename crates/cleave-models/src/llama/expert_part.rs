//! Expert split across runtimes: the experts that devices of another
//! runtime than the main device's own, of every block. The main part of
//! the model (attention, routers, KV cache) sends each routed expert's
//! rows here through the host and takes its output back; the experts run
//! here as they would on a device of the main part, cached and fetched
//! alike.

use cleave_nn::{
    HostRows, Input, ModelError, Part, Placed, Placement, Result, UploadCounters, UploadStats, WeightSource,
};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::Activation;

use super::config::ModelConfig;
use super::load::{upload_while_running, BlockLoader};
use super::moe::{ExpertCache, ExpertFetch, ExpertsElsewhere};

/// The experts one runtime's devices own, with their caches.
pub(crate) struct ExpertPart<R: Runtime> {
    placement: Placement<R>,
    config: ModelConfig,
    /// Where experts a cache lacks are read from.
    source: WeightSource,
    /// Each block's caches, one per device that owns experts.
    caches: Vec<Vec<ExpertCache>>,
    uploads: UploadCounters,
}

impl<R: Runtime> ExpertPart<R> {
    /// Uploads the experts `plan` (this runtime's part of an expert-split
    /// plan) gives `devices`, as many of each block's as their caches hold.
    pub(crate) fn load(
        devices: Vec<Placed<R>>,
        plan: Plan,
        config: &ModelConfig,
        source: WeightSource,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self> {
        let loader = source.loader(&devices, source.lora_mode, progress);
        let blocks = BlockLoader {
            loader: &loader,
            config,
            plan: &plan,
        };
        let caches = (0..config.layers)
            .map(|layer| blocks.expert_caches(layer))
            .collect::<Result<Vec<_>>>()?;
        Ok(ExpertPart {
            placement: Placement::new(devices, plan),
            config: config.clone(),
            source,
            caches,
            uploads: UploadCounters::default(),
        })
    }
}

impl<R: Runtime> ExpertsElsewhere for ExpertPart<R> {
    fn holds(&self, expert: usize) -> bool {
        self.caches
            .first()
            .is_some_and(|caches| caches.iter().any(|c| c.owned.contains(&expert)))
    }

    fn forward(&self, layer: usize, expert: usize, rows: HostRows, activation: Activation) -> Result<HostRows> {
        let cache = self
            .caches
            .get(layer)
            .and_then(|caches| caches.iter().find(|c| c.owned.contains(&expert)));
        let cache = cache.ok_or_else(|| {
            ModelError::Device(format!(
                "expert {expert} of block {layer} was sent to a part that does not hold it"
            ))
        })?;
        let load = |expert, device| {
            let fetch = |blocks: &BlockLoader<R>| blocks.expert(layer, expert, device);
            upload_while_running(&self.source, &self.placement, &self.config, &self.uploads, fetch)
        };
        let fetch = ExpertFetch {
            layer,
            load: &load,
            counters: &self.uploads,
            elsewhere: &[],
        };
        let mlp = cache.get(expert, &fetch)?;
        let client = self.placement.client(cache.device);
        let output = mlp.forward(
            &self.placement,
            cache.device,
            Input::plain(&rows.upload(client)),
            activation,
        )?;
        HostRows::read(client, &output)
    }
}

impl<R: Runtime> Part for ExpertPart<R> {
    fn upload_stats(&self) -> UploadStats {
        self.uploads.stats()
    }

    fn bytes_in_use(&self) -> Result<Vec<u64>> {
        self.placement.bytes_in_use()
    }

    fn model_bytes_in_use(&self) -> Result<Vec<u64>> {
        self.placement.model_bytes_in_use()
    }
}
