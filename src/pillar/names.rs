//! Names of compute nodes and VMs: validation and the historical id mangling.

use crate::error::{Error, Result};

/// Longest accepted minion id.
const MAX_LEN: usize = 253;

/// Checks that `name` is a usable minion id (letters, digits, `.`, `-`, `_`),
/// so that it can never escape a directory, be taken for a command-line
/// option or break a configuration file. `what` names the role in the error
/// ("compute node", "VM"). The error is an [`Error::Argument`]; callers that
/// read the name from pillar turn it into a configuration error with
/// [`Error::in_pillar`].
pub fn validate(what: &str, name: &str) -> Result<()> {
    let bad = |why: String| {
        Err(Error::argument(format!(
            "invalid {what} name {name:?}: {why}; use a minion id made of letters, digits, '.', '-' and '_'"
        )))
    };
    if name.is_empty() {
        return bad("it is empty".into());
    }
    if name.len() > MAX_LEN {
        return bad(format!("it is longer than {MAX_LEN} characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return bad(format!("character {c:?} is not allowed"));
    }
    if name.starts_with('.') || name.contains("..") {
        return bad("it starts with '.' or contains '..'".into());
    }
    if name.starts_with('-') {
        return bad("it starts with '-' (it would read as a command-line option)".into());
    }
    Ok(())
}

/// `mc_cloud_controller.gen_id`: replaces every `.` by `-` and nothing else.
pub fn gen_id(name: &str) -> String {
    name.replace('.', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gen_id_only_replaces_dots() {
        assert_eq!(gen_id("devhost10.local"), "devhost10-local");
        assert_eq!(gen_id("Dev_Box.lan"), "Dev_Box-lan");
        assert_eq!(gen_id("a b/c"), "a b/c");
    }

    #[test]
    fn accepts_minion_ids() {
        for ok in [
            "devhost10.local",
            "Dev_Box.lan",
            "a",
            "mysupertest3.foo.com",
            "x-1_2",
        ] {
            validate("VM", ok).unwrap();
        }
    }

    #[test]
    fn rejects_path_tricks_and_controls() {
        for bad in [
            "", "a/b", "..", "../etc", "a..b", ".hidden", "a b", "a\nb", "a\u{7}", "é", "-rf",
            "--help",
        ] {
            let err = validate("VM", bad).unwrap_err().to_string();
            assert!(err.contains("invalid VM name"), "{bad:?}: {err}");
        }
        assert!(validate("VM", &"a".repeat(300)).is_err());
    }
}
