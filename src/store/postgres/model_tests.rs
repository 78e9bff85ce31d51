//! The PostgreSQL store against the SQLite one as its model: random
//! transactions of every operation, on small domains where values
//! collide, run on both. Each must succeed with the same answers or fail
//! on both; afterwards both stores hold the same rows and answer every
//! question the same way, in a read-only transaction and in a new one.
//! This is what shows that a PostgreSQL transaction, which remembers what
//! it read and writes its changes at the end, behaves as one that asks
//! and writes each time.

use crate::alloc::Kind;
use proptest::prelude::*;

use super::tests::Server;
use super::PgStore;
use crate::store::*;

const NODES: [&str; 2] = ["cn1", "cn2"];
const VMS: [&str; 3] = ["a", "b", "c"];
const KINDS: [&str; 4] = ["ip", "ssh", "snmp", "idmap"];
const SLOTS: [&str; 2] = ["", "x"];
/// How many MACs the transactions use (see [`mac`]).
const MACS: usize = 4;
/// MAC `m`: the last is the one a PostgreSQL transaction guesses when it
/// reads VM a on cn1 (the first one allocation proposes for it).
fn mac(m: usize) -> String {
    if m + 1 == MACS {
        crate::pools::mac::candidate(NODES[0], VMS[0], "", 0)
    } else {
        format!("m{m}")
    }
}

const POOLS: [&str; 3] = ["ip:net", "ssh:range", "snmp:range"];

#[derive(Debug, Clone)]
enum Op {
    Number(usize, usize, usize),
    Owner(usize, usize, u32),
    Numbers(usize, usize),
    Space(usize, usize),
    PutSlot(usize, usize, usize, usize, u32),
    ExtraIps(usize, usize),
    RemoveSlot(usize, usize, usize, usize),
    Hint(usize, usize),
    SetHint(usize, usize, u32),
    Mac(usize, usize, usize),
    MacOwner(usize),
    PutMac(usize, usize, usize, usize),
    ForgetMac(usize),
    Macs(usize),
    RetireExcept(usize, usize, bool),
    Password(usize, usize),
    PutPassword(usize, usize, u8),
    Salt(usize, usize),
    PutSalt(usize, usize, u8),
    RemovePassword(usize, usize),
    Vms(usize),
    HeldElsewhere(usize),
    OtherNodesOf(usize, usize),
    SetDestroyed(usize, usize, bool),
    Destroyed(usize),
    Nodes,
    IsNode(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let n = 0..NODES.len();
    let v = 0..VMS.len();
    let k = 0..KINDS.len();
    let s = 0..SLOTS.len();
    let m = 0..MACS;
    let p = 0..POOLS.len();
    prop_oneof![
        1 => (k.clone(), n.clone(), v.clone()).prop_map(|(k, n, v)| Op::Number(k, n, v)),
        1 => (k.clone(), n.clone(), 1..6u32).prop_map(|(k, n, x)| Op::Owner(k, n, x)),
        1 => (k.clone(), n.clone()).prop_map(|(k, n)| Op::Numbers(k, n)),
        1 => (k.clone(), n.clone()).prop_map(|(k, n)| Op::Space(k, n)),
        4 => (k.clone(), n.clone(), v.clone(), s.clone(), 1..6u32)
            .prop_map(|(k, n, v, s, x)| Op::PutSlot(k, n, v, s, x)),
        1 => (n.clone(), v.clone()).prop_map(|(n, v)| Op::ExtraIps(n, v)),
        3 => (k, n.clone(), v.clone(), s.clone()).prop_map(|(k, n, v, s)| Op::RemoveSlot(k, n, v, s)),
        1 => (p.clone(), n.clone()).prop_map(|(p, n)| Op::Hint(p, n)),
        3 => (p, n.clone(), 1..6u32).prop_map(|(p, n, x)| Op::SetHint(p, n, x)),
        1 => (n.clone(), v.clone(), s.clone()).prop_map(|(n, v, s)| Op::Mac(n, v, s)),
        1 => m.clone().prop_map(Op::MacOwner),
        3 => (n.clone(), v.clone(), s, m.clone()).prop_map(|(n, v, s, m)| Op::PutMac(n, v, s, m)),
        1 => m.prop_map(Op::ForgetMac),
        1 => n.clone().prop_map(Op::Macs),
        1 => (n.clone(), v.clone(), any::<bool>()).prop_map(|(n, v, b)| Op::RetireExcept(n, v, b)),
        1 => (n.clone(), v.clone()).prop_map(|(n, v)| Op::Password(n, v)),
        1 => (n.clone(), v.clone(), 0..3u8).prop_map(|(n, v, x)| Op::PutPassword(n, v, x)),
        1 => (n.clone(), v.clone()).prop_map(|(n, v)| Op::Salt(n, v)),
        1 => (n.clone(), v.clone(), 0..3u8).prop_map(|(n, v, x)| Op::PutSalt(n, v, x)),
        1 => (n.clone(), v.clone()).prop_map(|(n, v)| Op::RemovePassword(n, v)),
        1 => n.clone().prop_map(Op::Vms),
        1 => n.clone().prop_map(Op::HeldElsewhere),
        1 => (v.clone(), n.clone()).prop_map(|(v, n)| Op::OtherNodesOf(v, n)),
        1 => (n.clone(), v, any::<bool>()).prop_map(|(n, v, b)| Op::SetDestroyed(n, v, b)),
        1 => n.prop_map(Op::Destroyed),
        1 => Just(Op::Nodes),
        1 => (0..NODES.len()).prop_map(Op::IsNode),
    ]
}

/// Runs `op` in `tx`; its answer, as text.
fn run(tx: &Tx, op: &Op) -> Result<String> {
    let owner = |o: Option<NumberOwner>| format!("{:?}", o.map(|o| (o.vm, o.kind, o.slot)));
    Ok(match *op {
        Op::Number(k, n, v) => {
            format!("{:?}", tx.number(Kind::parse(KINDS[k])?, NODES[n], VMS[v])?)
        }
        Op::Owner(k, n, x) => owner(tx.owner(Kind::parse(KINDS[k])?, NODES[n], x)?),
        Op::Numbers(k, n) => format!("{:?}", tx.numbers(Kind::parse(KINDS[k])?, NODES[n])?),
        Op::Space(k, n) => format!("{:?}", tx.space(Kind::parse(KINDS[k])?, NODES[n])?),
        Op::PutSlot(k, n, v, s, x) => {
            format!(
                "{:?}",
                tx.put_slot(Kind::parse(KINDS[k])?, NODES[n], VMS[v], SLOTS[s], x)?
            )
        }
        Op::ExtraIps(n, v) => format!("{:?}", tx.extra_ips(NODES[n], VMS[v])?),
        Op::RemoveSlot(k, n, v, s) => format!(
            "{:?}",
            tx.remove_slot(Kind::parse(KINDS[k])?, NODES[n], VMS[v], SLOTS[s])?
        ),
        Op::Hint(p, n) => format!("{:?}", tx.hint(POOLS[p], NODES[n])?),
        Op::SetHint(p, n, x) => format!("{:?}", tx.set_hint(POOLS[p], NODES[n], x)?),
        Op::Mac(n, v, s) => format!("{:?}", tx.mac(NODES[n], VMS[v], SLOTS[s])?),
        Op::MacOwner(m) => format!(
            "{:?}",
            tx.mac_owner(&mac(m))?
                .map(|o| (o.cn, o.vm, o.slot, o.retired))
        ),
        Op::PutMac(n, v, s, m) => format!("{:?}", tx.put_mac(NODES[n], VMS[v], SLOTS[s], &mac(m))?),
        Op::ForgetMac(m) => format!("{:?}", tx.forget_mac(&mac(m))?),
        Op::Macs(n) => format!("{:?}", tx.macs(NODES[n])?),
        Op::RetireExcept(n, v, keep) => {
            let keep: &[&str] = if keep { &[""] } else { &[] };
            format!("{:?}", tx.retire_macs_except(NODES[n], VMS[v], keep)?)
        }
        Op::Password(n, v) => format!("{:?}", tx.password(NODES[n], VMS[v])?),
        Op::PutPassword(n, v, x) => {
            format!(
                "{:?}",
                tx.put_password(NODES[n], VMS[v], &format!("pw{x}"))?
            )
        }
        Op::Salt(n, v) => format!("{:?}", tx.salt(NODES[n], VMS[v])?),
        Op::PutSalt(n, v, x) => format!("{:?}", tx.put_salt(NODES[n], VMS[v], &format!("s{x}"))?),
        Op::RemovePassword(n, v) => format!("{:?}", tx.remove_password(NODES[n], VMS[v])?),
        Op::Vms(n) => format!("{:?}", tx.vms(NODES[n])?),
        Op::HeldElsewhere(n) => {
            let mut held = tx.held_elsewhere(NODES[n])?;
            held.sort();
            format!("{held:?}")
        }
        Op::OtherNodesOf(v, n) => format!("{:?}", tx.other_nodes_of(VMS[v], NODES[n])?),
        Op::SetDestroyed(n, v, d) => format!("{:?}", tx.set_destroyed(NODES[n], VMS[v], d)?),
        Op::Destroyed(n) => format!("{:?}", tx.destroyed(NODES[n])?),
        Op::Nodes => format!("{:?}", tx.nodes()?),
        Op::IsNode(n) => format!("{:?}", tx.is_node(NODES[n])?),
    })
}

/// Every question the stores answer, over the whole domain (about VMs
/// before nodes when `vms_first`).
fn every_answer(tx: &Tx, vms_first: bool) -> Result<Vec<String>> {
    let mut ops = vec![Op::Nodes];
    for n in 0..NODES.len() {
        ops.extend([
            Op::IsNode(n),
            Op::Macs(n),
            Op::Vms(n),
            Op::HeldElsewhere(n),
            Op::Destroyed(n),
        ]);
        for p in 0..POOLS.len() {
            ops.push(Op::Hint(p, n));
        }
        for k in 0..KINDS.len() {
            ops.extend([Op::Numbers(k, n), Op::Space(k, n)]);
            ops.extend((1..6).map(|x| Op::Owner(k, n, x)));
        }
        for v in 0..VMS.len() {
            ops.extend([
                Op::ExtraIps(n, v),
                Op::Password(n, v),
                Op::Salt(n, v),
                Op::OtherNodesOf(v, n),
            ]);
            ops.extend((0..KINDS.len()).map(|k| Op::Number(k, n, v)));
            ops.extend((0..SLOTS.len()).map(|s| Op::Mac(n, v, s)));
        }
    }
    ops.extend((0..MACS).map(Op::MacOwner));
    if vms_first {
        ops.reverse();
    }
    ops.iter().map(|op| run(tx, op)).collect()
}

/// The rows of a store but its metadata (each store has its identity).
fn rows(mut d: dump::Dump) -> dump::Dump {
    d.tables.remove("meta");
    d
}

/// Runs `txs` on a new SQLite store and on `pg` emptied: the same
/// answers, failures and rows.
fn same(
    pg: &mut PgStore,
    admin: &mut ::postgres::Client,
    txs: &[Vec<Op>],
) -> std::result::Result<(), TestCaseError> {
    admin
        .batch_execute("TRUNCATE numbers, macs, passwords, salts, destroyed, hints")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut lite = Store::open(dir.path()).unwrap();
    for ops in txs {
        let script = |tx: &Tx| ops.iter().map(|op| run(tx, op)).collect::<Result<Vec<_>>>();
        let want = lite.write(|tx| script(tx));
        let got = pg.write(|tx| script(tx));
        match (&want, &got) {
            (Ok(w), Ok(g)) => prop_assert_eq!(w, g),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(
                false,
                "SQLite {:?} but PostgreSQL {:?} for {:?}",
                want,
                got,
                ops
            ),
        }
        let (lite_rows, pg_rows) = (rows(lite.dump().unwrap()), rows(pg.dump().unwrap()));
        prop_assert!(
            lite_rows.differences(&pg_rows).is_none(),
            "{:?} after {:?}",
            lite_rows.differences(&pg_rows),
            ops
        );
        for vms_first in [false, true] {
            let want = lite.read(|tx| every_answer(tx, vms_first)).unwrap();
            prop_assert_eq!(&want, &pg.read(|tx| every_answer(tx, vms_first)).unwrap());
            // and a write transaction that only reads knows the same
            prop_assert_eq!(&want, &pg.write(|tx| every_answer(tx, vms_first)).unwrap());
        }
    }
    Ok(())
}

#[test]
fn postgresql_transactions_behave_as_sqlite_ones() {
    let Some(server) = Server::start() else {
        return;
    };
    let info = server.conninfo("model");
    let pg = std::cell::RefCell::new(PgStore::connect(&info).unwrap());
    let admin =
        std::cell::RefCell::new(::postgres::Client::connect(&info, ::postgres::NoTls).unwrap());
    // what random ones may miss: a freed value lowers the hints of its
    // space; a value or MAC moves within one transaction
    let fixed = [
        vec![
            vec![
                Op::SetHint(1, 0, 3),
                Op::SetHint(2, 0, 4),
                Op::PutSlot(2, 0, 0, 0, 2),
            ],
            vec![Op::RemoveSlot(2, 0, 0, 0), Op::Hint(1, 0), Op::Hint(2, 0)],
        ],
        vec![
            vec![Op::PutSlot(0, 0, 0, 0, 1), Op::PutSlot(0, 0, 1, 0, 2)],
            vec![
                Op::RemoveSlot(0, 0, 0, 0),
                Op::PutSlot(0, 0, 1, 0, 1),
                Op::PutSlot(0, 0, 0, 0, 2),
            ],
        ],
        vec![vec![
            Op::PutMac(0, 0, 0, 0),
            Op::RetireExcept(0, 0, false),
            Op::ForgetMac(0),
            Op::PutMac(1, 1, 0, 0),
        ]],
    ];
    for txs in fixed {
        same(&mut pg.borrow_mut(), &mut admin.borrow_mut(), &txs).unwrap();
    }
    let config = ProptestConfig {
        cases: 160,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(txs in prop::collection::vec(prop::collection::vec(op(), 1..30), 1..5))| {
        same(&mut pg.borrow_mut(), &mut admin.borrow_mut(), &txs)?;
    });
}
