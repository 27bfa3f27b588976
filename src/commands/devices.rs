use anyhow::Result;
use cleave_device::list_devices;

use crate::output::outln;
use crate::Format;

#[derive(clap::Args)]
pub struct DevicesArgs {
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

fn gib(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
}

pub fn run(args: DevicesArgs) -> Result<()> {
    let devices = list_devices();
    match args.format {
        Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "devices": devices }))?
        )?,
        Format::Text if devices.is_empty() => eprintln!("no compute devices found"),
        Format::Text => {
            outln!(
                "{:<10} {:<8} {:<10} {:>10} {:>10}  {:<13}  adapter",
                "name",
                "backend",
                "type",
                "total",
                "free",
                "memory from"
            )?;
            for d in devices {
                outln!(
                    "{:<10} {:<8} {:<10} {:>10} {:>10}  {:<13}  {}",
                    d.name,
                    d.backend.prefix(),
                    d.device_type,
                    gib(d.total_bytes),
                    gib(d.free_bytes),
                    d.memory_source.map_or("-", |s| s.label()),
                    d.adapter
                )?;
            }
        }
    }
    Ok(())
}
