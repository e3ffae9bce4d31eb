//! Planning a batch of transactions before any write is made: which
//! compares hold, which operations apply, and the revision of each. The
//! SQLite backend reads the current revisions of the keys the batch compares
//! or deletes once, plans, then writes. (PostgreSQL makes the same decisions
//! inside its `herd_commit` function, to spend one round trip per batch; the
//! conformance suite holds both to the same results.)

use std::collections::HashMap;

use crate::types::{Op, Revision, Txn, TxnOutcome};

/// One write the batch will make, with its revision.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Write<'a> {
    Put { key: &'a str, value: &'a [u8], revision: Revision },
    Delete { key: &'a str, revision: Revision },
}

#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub outcomes: Vec<TxnOutcome>,
    pub writes: Vec<Write<'a>>,
}

/// The keys whose current revision the plan needs: those compared and
/// those deleted (a delete of an absent key uses no revision).
pub(crate) fn keys_to_read(batch: &[Txn]) -> Vec<String> {
    let mut keys: Vec<String> = batch
        .iter()
        .flat_map(|txn| {
            let compared = txn.compares.iter().map(|c| c.key());
            let deleted = txn.ops.iter().filter_map(|op| match op {
                Op::Delete { key } => Some(key.as_str()),
                Op::Put { .. } => None,
            });
            compared.chain(deleted)
        })
        .map(str::to_string)
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Plans `batch` on a store at `head` whose keys from [`keys_to_read`] have
/// the mod revisions in `current` (absent: no such key). Each transaction
/// sees the effects of the ones before it.
pub(crate) fn plan<'a>(batch: &'a [Txn], mut head: Revision, current: &HashMap<String, Revision>) -> Plan<'a> {
    let mut overlay: HashMap<&str, Option<Revision>> = HashMap::new();
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut writes = Vec::new();
    for txn in batch {
        let revision_of = |key: &str, overlay: &HashMap<&str, Option<Revision>>| match overlay.get(key) {
            Some(state) => *state,
            None => current.get(key).copied(),
        };
        let failed = txn.compares.iter().enumerate().find_map(|(index, compare)| {
            let actual = revision_of(compare.key(), &overlay);
            (!compare.holds(actual)).then(|| TxnOutcome::CompareFailed {
                index,
                key: compare.key().to_string(),
                actual,
            })
        });
        if let Some(failed) = failed {
            outcomes.push(failed);
            continue;
        }
        for op in &txn.ops {
            match op {
                Op::Put { key, value } => {
                    head += 1;
                    overlay.insert(key, Some(head));
                    writes.push(Write::Put { key, value, revision: head });
                }
                Op::Delete { key } => {
                    if revision_of(key, &overlay).is_some() {
                        head += 1;
                        overlay.insert(key, None);
                        writes.push(Write::Delete { key, revision: head });
                    }
                }
            }
        }
        outcomes.push(TxnOutcome::Committed { revision: head });
    }
    Plan { outcomes, writes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Compare;

    #[test]
    fn later_transactions_see_earlier_ones() {
        let batch = vec![
            Txn::new().when(Compare::ModRevision { key: "/a".into(), revision: 0 }).put("/a", b"1".to_vec()),
            // Fails: /a exists now (created just before, in the same batch).
            Txn::new().when(Compare::ModRevision { key: "/a".into(), revision: 0 }).put("/a", b"2".to_vec()),
            Txn::new().when(Compare::ModRevision { key: "/a".into(), revision: 11 }).delete("/a").delete("/missing"),
            Txn::new().when(Compare::Exists { key: "/b".into() }).put("/c", b"3".to_vec()),
        ];
        let current = HashMap::from([("/b".to_string(), 4)]);
        let plan = plan(&batch, 10, &current);
        assert_eq!(
            plan.outcomes,
            vec![
                TxnOutcome::Committed { revision: 11 },
                TxnOutcome::CompareFailed { index: 0, key: "/a".into(), actual: Some(11) },
                TxnOutcome::Committed { revision: 12 },
                TxnOutcome::Committed { revision: 13 },
            ]
        );
        assert_eq!(
            plan.writes,
            vec![
                Write::Put { key: "/a", value: b"1", revision: 11 },
                Write::Delete { key: "/a", revision: 12 },
                Write::Put { key: "/c", value: b"3", revision: 13 },
            ]
        );
        assert_eq!(keys_to_read(&batch), ["/a", "/b", "/missing"]);
    }
}
