//! Token usage and pricing.

use serde::{Deserialize, Serialize};

/// Tokens consumed by one or more model calls.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Usage {
    /// Prompt tokens not read from or written to a cache.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Reasoning tokens (already counted in `output_tokens` by providers that report them).
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    /// `input + cache_read + cache_write + output`.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.cache_read_tokens + self.cache_write_tokens + self.output_tokens
    }

    /// Prompt tokens, cache included.
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}

/// Prices in dollars per million tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    /// Input tokens.
    #[serde(default)]
    pub input: f64,
    /// Output tokens.
    #[serde(default)]
    pub output: f64,
    /// Cache reads.
    #[serde(default)]
    pub cache_read: f64,
    /// Cache writes.
    #[serde(default)]
    pub cache_write: f64,
    /// Higher rates above a prompt size; `above` strictly increasing.
    #[serde(default)]
    pub tiers: Vec<PriceTier>,
}

/// Rates that apply when the prompt (input + cache) exceeds `above` tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceTier {
    /// Prompt-token threshold.
    pub above: u64,
    /// Input rate, else the base rate.
    #[serde(default)]
    pub input: Option<f64>,
    /// Output rate, else the base rate.
    #[serde(default)]
    pub output: Option<f64>,
    /// Cache-read rate, else the base rate.
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Cache-write rate, else the base rate.
    #[serde(default)]
    pub cache_write: Option<f64>,
}

impl Pricing {
    /// Checks that tiers are strictly increasing and rates are not negative.
    pub fn check(&self) -> Result<(), String> {
        let rates = [self.input, self.output, self.cache_read, self.cache_write];
        if rates.iter().any(|r| *r < 0.0 || !r.is_finite()) {
            return Err("prices must be finite and not negative".into());
        }
        for pair in self.tiers.windows(2) {
            if pair[1].above <= pair[0].above {
                return Err("pricing tiers must have strictly increasing 'above'".into());
            }
        }
        Ok(())
    }

    /// The cost in dollars of `usage`, with the highest tier whose `above` is below the prompt.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let prompt = usage.prompt_tokens();
        let tier = self.tiers.iter().rev().find(|t| prompt > t.above);
        let pick = |base: f64, over: Option<f64>| over.unwrap_or(base);
        let (input, output, cache_read, cache_write) = match tier {
            Some(t) => (
                pick(self.input, t.input),
                pick(self.output, t.output),
                pick(self.cache_read, t.cache_read),
                pick(self.cache_write, t.cache_write),
            ),
            None => (self.input, self.output, self.cache_read, self.cache_write),
        };
        (usage.input_tokens as f64 * input
            + usage.output_tokens as f64 * output
            + usage.cache_read_tokens as f64 * cache_read
            + usage.cache_write_tokens as f64 * cache_write)
            / 1_000_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_with_tiers() {
        let pricing = Pricing {
            input: 3.0,
            output: 15.0,
            tiers: vec![PriceTier {
                above: 200_000,
                input: Some(6.0),
                ..Default::default()
            }],
            ..Default::default()
        };
        let small = Usage {
            input_tokens: 100_000,
            output_tokens: 0,
            ..Default::default()
        };
        assert!((pricing.cost(&small) - 0.3).abs() < 1e-9);
        let big = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            ..Default::default()
        };
        assert!((pricing.cost(&big) - 21.0).abs() < 1e-9);
        assert_eq!(big.total_tokens(), 2_000_000);
    }

    #[test]
    fn tiers_must_increase() {
        let pricing = Pricing {
            tiers: vec![
                PriceTier {
                    above: 10,
                    ..Default::default()
                },
                PriceTier {
                    above: 10,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert!(pricing.check().is_err());
    }
}
