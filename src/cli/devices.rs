//! `grpo devices`: the plugin, its versions and the devices it drives.

use super::platform::PlatformArgs;

/// Prints the plugin and its devices.
pub fn run(args: &PlatformArgs) -> anyhow::Result<()> {
    let client = args.client()?;
    let plugin = client.plugin();
    let (major, minor) = plugin.api_version();
    println!("plugin:    {}", plugin.path().display());
    println!("PJRT API:  {major}.{minor}");
    for (name, value) in plugin.attributes() {
        println!("  {name}: {value}");
    }
    println!("platform:  {} {}", client.platform_name(), client.platform_version());
    println!("devices:   {}", client.devices().len());
    for device in client.devices() {
        println!(
            "  [{}] id {} kind {} (process {}, hardware {}): {}",
            device.index(),
            device.id(),
            device.kind(),
            device.process_index(),
            device.local_hardware_id(),
            device.description()
        );
        if let Ok(stats) = client.memory_stats(device) {
            println!(
                "      memory in use {} bytes, limit {:?}",
                stats.bytes_in_use, stats.bytes_limit
            );
        }
    }
    Ok(())
}
