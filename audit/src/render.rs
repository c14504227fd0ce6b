//! The report for people.

use crate::finding::AuditReport;

impl AuditReport {
    /// The report for people: one block per finding and a summary line.
    /// Written here, beside the rest of the layout, so that the findings
    /// do not depend on how they are drawn.
    pub fn render_table(&self) -> String {
        table(self)
    }
}

/// A header and one row per finding (severity, rule, location, object), each
/// row followed by its message and fix, indented; then the counts.
fn table(report: &AuditReport) -> String {
    let mut out = String::new();
    let s = &report.summary;
    if report.findings.is_empty() {
        out.push_str("no findings\n");
        return out;
    }
    let rows: Vec<[String; 4]> = report
        .findings
        .iter()
        .map(|f| {
            [
                f.severity.as_str().to_ascii_uppercase(),
                f.rule.id().to_owned(),
                format!("{}:{}", f.file, f.line),
                f.object.clone(),
            ]
        })
        .collect();
    let header = ["SEVERITY", "RULE", "LOCATION", "OBJECT"];
    let mut width = header.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: [&str; 4]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        l.trim_end().to_owned() + "\n"
    };
    out.push_str(&line(header));
    let indent = " ".repeat(width[0] + 2);
    for (r, f) in rows.iter().zip(&report.findings) {
        out.push_str(&line([&r[0], &r[1], &r[2], &r[3]]));
        out.push_str(&format!("{indent}{}\n", f.message));
        out.push_str(&format!("{indent}fix: {}\n", f.fix));
    }
    out.push_str(&format!(
        "\n{} high, {} medium, {} low\n",
        s.high, s.medium, s.low
    ));
    out
}

#[cfg(test)]
mod tests {
    use crate::finding::{AuditReport, Finding, Rule};

    #[test]
    fn rows_are_aligned_and_counted() {
        let r = AuditReport::from_findings(vec![
            Finding::new(
                Rule::ConcurrencyAllow,
                "k8s/a.yaml",
                12,
                "blog/p",
                "Two at once.",
                "Forbid.",
            ),
            Finding::new(
                Rule::MissingTimezone,
                "k8s/a.yaml",
                7,
                "blog/p",
                "No zone.",
                "Set one.",
            ),
        ]);
        let t = r.render_table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "SEVERITY  RULE               LOCATION       OBJECT"
        );
        assert_eq!(
            lines[1],
            "HIGH      concurrency-allow  k8s/a.yaml:12  blog/p"
        );
        assert_eq!(lines[2], "          Two at once.");
        assert_eq!(lines[3], "          fix: Forbid.");
        assert_eq!(
            lines[4],
            "LOW       missing-timezone   k8s/a.yaml:7   blog/p"
        );
        assert_eq!(lines.last(), Some(&"1 high, 0 medium, 1 low"));
        assert_eq!(
            AuditReport::from_findings(vec![]).render_table(),
            "no findings\n"
        );
    }
}
