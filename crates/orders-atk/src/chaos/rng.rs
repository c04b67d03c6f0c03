//! The run's randomness: SplitMix64, seeded, so that a run's choices (its
//! clients' operations, its proxy's faults) follow from `--seed`.

/// A small seeded generator (SplitMix64); not for secrets.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Another generator for stream `n` of this seed (a client, the proxy).
    pub fn fork(seed: u64, n: u64) -> Self {
        let mut mixer = Self::new(seed ^ n.wrapping_mul(0xA076_1D64_78BD_642F));
        Self(mixer.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is `0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.next_u64() % n
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low.saturating_add(self.below(high.saturating_sub(low).saturating_add(1)))
    }

    /// `true` with probability `percent` / 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// The index chosen by `weights` (each its relative chance).
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut pick = self.below(total);
        for (i, weight) in weights.iter().enumerate() {
            if pick < *weight {
                return i;
            }
            pick -= weight;
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_gives_one_sequence_and_forks_differ() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(Rng::fork(7, 1).next_u64(), Rng::fork(7, 2).next_u64());
    }

    #[test]
    fn draws_stay_in_their_bounds() {
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            assert!(r.below(3) < 3);
            assert!((5..=9).contains(&r.between(5, 9)));
            assert!(r.weighted(&[0, 4, 0, 1]) % 2 == 1);
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.between(4, 4), 4);
    }
}
