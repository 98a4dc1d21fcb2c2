//! The settings document analytics.js loads before it sends anything.

use serde_json::Value;

/// The settings document Segment's browser library loads from
/// `<cdnURL>/v1/projects/<writeKey>/settings` before anything else: just enough to send every event
/// to `api_host` (`host[:port][/prefix]/v1`) over `protocol`, with no other destination, no
/// middleware and the library's own telemetry to Segment turned off.
pub fn settings_document(write_key: &str, api_host: &str, protocol: &str) -> Value {
    serde_json::json!({
        "integrations": {
            "Segment.io": {
                "apiKey": write_key,
                "apiHost": api_host,
                "protocol": protocol,
                "unbundledIntegrations": [],
                "addBundledMetadata": true,
                "maybeBundledConfigIds": {},
            }
        },
        "plan": {
            "track": { "__default": { "enabled": true, "integrations": {} } },
            "identify": { "__default": { "enabled": true } },
            "group": { "__default": { "enabled": true } },
        },
        "edgeFunction": {},
        "analyticsNextEnabled": true,
        "middlewareSettings": {},
        "enabledMiddleware": {},
        "metrics": { "sampleRate": 0 },
        "legacyVideoPluginsEnabled": false,
        "remotePlugins": [],
    })
}
