//! The front door: the one way Salt's modules, its runners and the command
//! line open the registry. A session is a configuration (context and
//! pillar), a store and a caller; opening it puts the VMs declared without a
//! compute node on the nodes the store places them on, and (when asked)
//! places those not placed yet, so that no caller assembles a configuration
//! twice.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::Registry;
use crate::error::{Error, Result};
use crate::settings::{Config, Context};

/// What opening a session does with the VMs declared without a compute
/// node (`makina-states.cloud.<vt>.anywhere`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// They stay on no node; the store is not read for them.
    Declared,
    /// As [`Place::Declared`], with the moves the store records read (the
    /// controller's sessions only): a moved VM is on its new node.
    /// What `mc_cloud.place` opens, which places one VM itself.
    Moves,
    /// They are on the nodes the store placed them on; those not placed
    /// yet stay on no node. Reads only (nothing is created).
    Stored,
    /// As [`Place::Stored`], then the rest (those not placed yet) are
    /// placed by policy: a write, which creates the store when there is
    /// none.
    Rest,
    /// [`Place::Rest`] when the store exists already, else
    /// [`Place::Stored`]: reading never creates a store.
    RestIfStored,
}

impl Place {
    /// The placing named `name`: `declared`, `moves`, `stored`, `rest`
    /// or `existing` ([`Place::RestIfStored`]).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "declared" => Ok(Place::Declared),
            "moves" => Ok(Place::Moves),
            "stored" => Ok(Place::Stored),
            "rest" => Ok(Place::Rest),
            "existing" => Ok(Place::RestIfStored),
            other => Err(Error::argument(format!(
                "place={other:?}: give 'declared', 'moves', 'stored', 'rest' or 'existing'"
            ))),
        }
    }
}

/// What a registry is opened over.
#[derive(Debug)]
pub struct Session<'a> {
    /// The Salt context the settings are computed in.
    pub context: Context,
    /// The pillar (its `makina-states.*` keys and `default_env`).
    pub pillar: Map<String, Value>,
    /// The store: a directory (SQLite) or a PostgreSQL connection string.
    pub location: &'a str,
    /// Who makes the changes, as the audit journal names it.
    pub caller: &'a str,
    /// What happens to the VMs declared without a node.
    pub placing: Place,
    /// Whether the caller is the controller whatever its minion id says
    /// (a master's runners, the command line). Otherwise only the minion
    /// the pillar names the controller (`makina-states.cloud.master`)
    /// reads and makes placements: it holds the store.
    pub controller: bool,
}

/// A remark made while a session was opened, for the caller's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Whether it is an error (else a warning).
    pub error: bool,
    /// What happened, for an operator.
    pub message: String,
}

impl Note {
    fn warning(message: String) -> Self {
        Note {
            error: false,
            message,
        }
    }
}

/// Placements: VM → node, and the VMs left on no node with why.
pub(crate) type Placements = (BTreeMap<String, String>, BTreeMap<String, String>);

impl Registry {
    /// Opens the registry of `session`, its VMs declared without a node
    /// placed as [`Session::placing`] says: the placements the store holds
    /// always apply; a VM whose size does not read, that fits nowhere, or
    /// a placement pillar that does not read fails alone (the calls about
    /// that VM, and drift, say why), the VMs placed before keeping their
    /// node. A store whose placements cannot be read leaves every such VM
    /// on no node, each saying why (never an error of the whole session).
    /// Returns the registry and what its log should say.
    pub fn session(session: Session<'_>) -> Result<(Registry, Vec<Note>)> {
        let config = Config::new(session.context, session.pillar);
        let mut registry =
            Registry::open(config, Path::new(session.location))?.with_caller(session.caller);
        let mut notes = vec![];
        if session.placing == Place::Declared {
            return Ok((registry, notes));
        }
        let controller = session.controller || registry.is_controller()?;
        if controller && registry.store_exists() {
            // The VMs moved away from their pillar node, and those moving
            // (a session taking what the pillar declares reads no store).
            match registry.stored_relocations() {
                Ok(((relocated, moving), problems)) => {
                    notes.extend(problems.into_iter().map(|p| Note {
                        error: true,
                        message: format!("mccloud: {p}"),
                    }));
                    if !(relocated.is_empty() && moving.is_empty()) {
                        registry.config = registry.config.with_moves(relocated, moving);
                    }
                }
                Err(e) => notes.push(Note {
                    error: true,
                    message: format!(
                        "mccloud: the moves the store records could not be read: {e}; the VMs \
                         moved to another node are seen on the node the pillar names"
                    ),
                }),
            }
        }
        if session.placing == Place::Moves {
            return Ok((registry, notes));
        }
        let anywhere = match registry.config.anywhere() {
            Ok(anywhere) => anywhere,
            Err(e) => {
                // Every call that reads them says why; nothing is placed.
                notes.push(Note::warning(format!(
                    "mccloud: the VMs declared without a compute node do not read: {e}"
                )));
                return Ok((registry, notes));
            }
        };
        if anywhere.is_empty() || !controller {
            return Ok((registry, notes));
        }
        let (placed, unplaced) = match registry.placements(session.placing) {
            Ok(done) => done,
            Err(e) => {
                notes.push(Note {
                    error: true,
                    message: format!(
                        "mccloud: the placements of the VMs declared without a compute node \
                         could not be read: {e}"
                    ),
                });
                let why = format!("the store's placements could not be read: {e}");
                let unplaced = anywhere.into_keys().map(|vm| (vm, why.clone())).collect();
                (BTreeMap::new(), unplaced)
            }
        };
        notes.extend(
            unplaced
                .iter()
                .map(|(vm, why)| Note::warning(format!("mccloud: VM {vm} is not placed: {why}"))),
        );
        registry.config = registry.config.with_placements(placed, unplaced);
        Ok((registry, notes))
    }

    /// Whether this registry's configuration is seen from the controller
    /// (its minion id is the pillar's `makina-states.cloud.master`).
    fn is_controller(&self) -> Result<bool> {
        let cloud = self.config.cloud_settings()?;
        Ok(cloud.get("master").and_then(Value::as_str) == Some(&self.config.context().minion_id))
    }

    /// Whether the store exists already (a PostgreSQL store always does).
    fn store_exists(&self) -> bool {
        self.postgres.is_some() || Path::new(&self.store_path()).exists()
    }

    /// The placements `placing` asks for (see [`Registry::session`]).
    fn placements(&self, placing: Place) -> Result<Placements> {
        let place = match placing {
            Place::Declared | Place::Moves | Place::Stored => false,
            Place::Rest => true,
            Place::RestIfStored => self.store_exists(),
        };
        if !place {
            let held = self.held_placements(&self.config.anywhere()?)?;
            return Ok((held, BTreeMap::new()));
        }
        self.placed_all()
    }
}
