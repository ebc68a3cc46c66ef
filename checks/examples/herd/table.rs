//! What the tables print: milliseconds, percentiles, stop reasons and the
//! arrivals' sparklines.

use std::collections::BTreeMap;
use std::time::Duration;

/// `▁▂▃▄▅▆▇█`, one character per 50 ms bucket, scaled to `peak`.
pub(crate) fn sparkline(arrivals: &[u32], peak: u32) -> String {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    arrivals
        .iter()
        .map(|&a| {
            if a == 0 {
                ' '
            } else {
                let level = (u64::from(a) * 8).div_ceil(u64::from(peak.max(1)));
                BLOCKS[(level.clamp(1, 8) - 1) as usize]
            }
        })
        .collect()
}

/// The latency at rank `ceil(p·n)` of `v` (zero when `v` is empty).
pub(crate) fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort_unstable();
    if v.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// `d` in whole milliseconds.
pub(crate) fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e3)
}

/// Stop reasons and their counts, `reason n, …`.
pub(crate) fn reasons(map: &BTreeMap<String, usize>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
