//! Time zones by name, and the machine's own: the zone of a crontab that
//! sets neither `CRON_TZ` nor `TZ`.

use chrono_tz::Tz;

/// The machine's time zone: `TZ` (an IANA name, optionally prefixed with `:`
/// or given as a path under `zoneinfo/`), else `/etc/timezone`, else the
/// target of the `/etc/localtime` symlink, else UTC. Unknown names fall
/// through to the next source.
pub fn machine_zone() -> Tz {
    let from_env = std::env::var("TZ").ok();
    let from_file = || std::fs::read_to_string("/etc/timezone").ok();
    let from_link = || {
        std::fs::read_link("/etc/localtime")
            .ok()
            .map(|p| p.display().to_string())
    };
    from_env
        .and_then(|s| zone_from_name(&s))
        .or_else(|| from_file().and_then(|s| zone_from_name(&s)))
        .or_else(|| from_link().and_then(|s| zone_from_name(&s)))
        .unwrap_or(Tz::UTC)
}

/// An IANA zone from `Europe/Berlin`, `:Europe/Berlin` or
/// `/usr/share/zoneinfo/Europe/Berlin`.
pub(crate) fn zone_from_name(s: &str) -> Option<Tz> {
    let s = s.trim().trim_start_matches(':');
    let s = match s.rfind("zoneinfo/") {
        Some(i) => &s[i + "zoneinfo/".len()..],
        None => s,
    };
    if s.is_empty() {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_names_are_read_in_all_their_spellings() {
        assert_eq!(
            zone_from_name("Europe/Berlin\n"),
            Some(chrono_tz::Europe::Berlin)
        );
        assert_eq!(
            zone_from_name(":America/New_York"),
            Some(chrono_tz::America::New_York)
        );
        assert_eq!(
            zone_from_name("/usr/share/zoneinfo/Asia/Shanghai"),
            Some(chrono_tz::Asia::Shanghai)
        );
        assert_eq!(zone_from_name("../zoneinfo/UTC"), Some(Tz::UTC));
        assert_eq!(zone_from_name("Not/AZone"), None);
        assert_eq!(zone_from_name(""), None);
    }
}
