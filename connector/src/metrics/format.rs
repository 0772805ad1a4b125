//! The two exposition formats `/metrics` answers in.

/// The Content-Type of `/metrics` for a scraper that asks for OpenMetrics
/// (Prometheus 2 and 3 do; Prometheus 3 refuses a scrape without a valid one).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The Content-Type of `/metrics` otherwise: the Prometheus text format
/// 0.0.4, which `curl … | promtool check metrics` lints (promtool reads no
/// OpenMetrics: it would take each counter's `_total` sample for a metric
/// of its own).
pub const TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Which exposition format `/metrics` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Text,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// it, the Prometheus text format otherwise.
    pub fn accepted(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => CONTENT_TYPE,
            Format::Text => TEXT_CONTENT_TYPE,
        }
    }
}
