//! Dividing n indivisible blocks among devices in proportion to weights,
//! without giving any device more than it can hold.

/// Largest-remainder apportionment of `n` by `weights`, each share capped
/// by `caps`; what a capped device cannot take goes to the others, still in
/// proportion. `None` if the caps together hold fewer than `n`.
pub(crate) fn apportion(n: usize, weights: &[f64], caps: &[usize]) -> Option<Vec<usize>> {
    let mut counts = vec![0usize; weights.len()];
    let mut remaining = n;
    while remaining > 0 {
        let open: Vec<usize> = (0..weights.len())
            .filter(|&i| weights[i] > 0.0 && counts[i] < caps[i])
            .collect();
        let total: f64 = open.iter().map(|&i| weights[i]).sum();
        if open.is_empty() || total <= 0.0 {
            return None;
        }
        let shares: Vec<(usize, f64)> = open
            .iter()
            .map(|&i| (i, remaining as f64 * weights[i] / total))
            .collect();
        let mut given = 0;
        for &(i, share) in &shares {
            let take = (share.floor() as usize).min(caps[i] - counts[i]);
            counts[i] += take;
            given += take;
        }
        // Hand out what flooring left, largest remainder first (ties: the
        // earlier device), one block each.
        let mut by_remainder = shares.clone();
        by_remainder.sort_by(|a, b| (b.1 - b.1.floor()).total_cmp(&(a.1 - a.1.floor())).then(a.0.cmp(&b.0)));
        for (i, _) in by_remainder {
            if given == remaining {
                break;
            }
            if counts[i] < caps[i] {
                counts[i] += 1;
                given += 1;
            }
        }
        remaining -= given;
    }
    Some(counts)
}

#[cfg(test)]
mod tests {
    use super::apportion;

    const NO_CAP: usize = usize::MAX;

    #[test]
    fn proportional() {
        assert_eq!(apportion(6, &[1.0, 1.0, 1.0], &[NO_CAP; 3]), Some(vec![2, 2, 2]));
        assert_eq!(apportion(8, &[3.0, 1.0], &[NO_CAP; 2]), Some(vec![6, 2]));
        assert_eq!(apportion(7, &[1.0, 1.0], &[NO_CAP; 2]), Some(vec![4, 3]));
    }

    #[test]
    fn caps_push_blocks_to_the_others() {
        assert_eq!(
            apportion(8, &[1.0, 1.0, 1.0], &[1, NO_CAP, NO_CAP]),
            Some(vec![1, 4, 3])
        );
        assert_eq!(apportion(8, &[1.0, 1.0], &[3, 4]), None);
    }

    #[test]
    fn zero_weight_gets_nothing() {
        assert_eq!(apportion(5, &[0.0, 1.0, 1.0], &[NO_CAP; 3]), Some(vec![0, 3, 2]));
        assert_eq!(apportion(2, &[0.0, 0.0], &[NO_CAP; 2]), None);
    }
}
