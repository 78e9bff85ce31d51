//! Every row of a store, store-independent: what `mccloud store migrate`
//! copies from SQLite to PostgreSQL (and compares afterwards, row by row),
//! and what a PostgreSQL store's backup writes into a SQLite file.

use std::collections::{BTreeMap, BTreeSet};

/// The type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Col {
    /// TEXT.
    Text,
    /// INTEGER (SQLite) / BIGINT (PostgreSQL).
    Int,
    /// INTEGER on both (a flag).
    Flag,
}

/// The tables of a store, with their columns, in an order that loads
/// without breaking a constraint.
pub const TABLES: &[(&str, &[(&str, Col)])] = &[
    ("meta", &[("key", Col::Text), ("value", Col::Text)]),
    (
        "numbers",
        &[
            ("kind", Col::Text),
            ("cn", Col::Text),
            ("vm", Col::Text),
            ("slot", Col::Text),
            ("value", Col::Int),
            ("space", Col::Text),
        ],
    ),
    (
        "macs",
        &[
            ("mac", Col::Text),
            ("cn", Col::Text),
            ("vm", Col::Text),
            ("slot", Col::Text),
            ("retired", Col::Flag),
        ],
    ),
    (
        "passwords",
        &[
            ("cn", Col::Text),
            ("vm", Col::Text),
            ("password", Col::Text),
        ],
    ),
    (
        "salts",
        &[("cn", Col::Text), ("vm", Col::Text), ("salt", Col::Text)],
    ),
    ("destroyed", &[("cn", Col::Text), ("vm", Col::Text)]),
    (
        "hints",
        &[("pool", Col::Text), ("cn", Col::Text), ("value", Col::Int)],
    ),
    ("placements", &[("vm", Col::Text), ("cn", Col::Text)]),
    (
        "sightings",
        &[
            ("kind", Col::Text),
            ("cn", Col::Text),
            ("vm", Col::Text),
            ("seen", Col::Int),
            ("since", Col::Text),
        ],
    ),
    (
        "journal",
        &[
            ("id", Col::Int),
            ("at", Col::Text),
            ("caller", Col::Text),
            ("kind", Col::Text),
            ("cn", Col::Text),
            ("vm", Col::Text),
            ("what", Col::Text),
            ("before_value", Col::Text),
            ("after_value", Col::Text),
        ],
    ),
    (
        "changes",
        &[("kind", Col::Text), ("cn", Col::Text), ("n", Col::Int)],
    ),
    (
        "last_runs",
        &[
            ("kind", Col::Text),
            ("cn", Col::Text),
            ("vm", Col::Text),
            ("result", Col::Text),
            ("millis", Col::Int),
        ],
    ),
    (
        "dns_records",
        &[
            ("zone", Col::Text),
            ("name", Col::Text),
            ("type", Col::Text),
            ("data", Col::Text),
            ("ttl", Col::Int),
            ("cn", Col::Text),
            ("vm", Col::Text),
            ("at", Col::Text),
        ],
    ),
    (
        "declarations",
        &[
            ("kind", Col::Text),
            ("name", Col::Text),
            ("cn", Col::Text),
            ("vt", Col::Text),
            ("settings", Col::Text),
            ("declared_by", Col::Text),
            ("at", Col::Text),
        ],
    ),
];

/// `SELECT <every column> FROM <table>`.
pub fn select_sql(table: &str, cols: &[(&str, Col)]) -> String {
    let names: Vec<&str> = cols.iter().map(|(c, _)| *c).collect();
    format!("SELECT {} FROM {table}", names.join(", "))
}

/// `INSERT INTO <table>(<every column>) VALUES (<mark>1, <mark>2, …)`
/// (`mark`: `?` for SQLite, `$` for PostgreSQL).
pub fn insert_sql(table: &str, cols: &[(&str, Col)], mark: char) -> String {
    let names: Vec<&str> = cols.iter().map(|(c, _)| *c).collect();
    let marks: Vec<String> = (1..=cols.len()).map(|i| format!("{mark}{i}")).collect();
    format!(
        "INSERT INTO {table}({}) VALUES ({})",
        names.join(", "),
        marks.join(", ")
    )
}

/// One value of a row.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Field {
    /// An integer column.
    Int(i64),
    /// A text column.
    Text(String),
}

/// Every row of every table of a store, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dump {
    /// Rows per table name (every table of [`TABLES`]).
    pub tables: BTreeMap<String, Vec<Vec<Field>>>,
}

impl Dump {
    /// Adds `rows` of `table`, sorted (stores order text differently).
    pub fn put(&mut self, table: &str, mut rows: Vec<Vec<Field>>) {
        rows.sort();
        self.tables.insert(table.to_string(), rows);
    }

    /// Rows per table.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        self.tables
            .iter()
            .map(|(t, rows)| (t.clone(), rows.len()))
            .collect()
    }

    /// The rows that are not the same in `other`, said per table (no
    /// value is shown: rows may hold secrets); None when every row is.
    pub fn differences(&self, other: &Dump) -> Option<String> {
        let mut out = vec![];
        for (table, _) in TABLES {
            let empty = vec![];
            let mine = self.tables.get(*table).unwrap_or(&empty);
            let theirs = other.tables.get(*table).unwrap_or(&empty);
            if mine != theirs {
                let (a, b): (BTreeSet<_>, BTreeSet<_>) =
                    (mine.iter().collect(), theirs.iter().collect());
                let missing = a.difference(&b).count();
                let extra = b.difference(&a).count();
                out.push(format!(
                    "{table}: {missing} rows missing, {extra} rows not in the source"
                ));
            }
        }
        (!out.is_empty()).then(|| out.join("; "))
    }
}
