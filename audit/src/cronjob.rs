//! Kubernetes manifests: `CronJob` objects (`apiVersion: batch/*`), at the
//! top level of any document of a multi-document stream or inside a
//! `kind: List`.
//!
//! Values are read with `serde_yaml_ng`; lines come from [`crate::yamlpos`].
//! A CronJob without `metadata.name` or `spec.schedule`, or with a value the
//! API server would reject (an unknown `timeZone` or `concurrencyPolicy`, a
//! non-integer `startingDeadlineSeconds`, an unparsable schedule) is an
//! error naming its line: the manifest cannot be audited as written.

use crate::command::{image_repo, normalize_argv, shell_words, GuardSignals};
use crate::finding::{AuditError, Finding, Rule};
use crate::scheduled::{EntryPoint, Origin, Scheduled};
use crate::yamlpos::{split_documents, Document};
use ::slotgate::cron::Schedule;
use chrono_tz::Tz;
use serde_yaml_ng::Value;

/// Kubernetes' default `spec.backoffLimit` of a Job.
pub(crate) const DEFAULT_BACKOFF_LIMIT: i64 = 6;

/// The pod template of a CronJob's Jobs.
const POD: &str = "spec.jobTemplate.spec.template.spec";

const KEY_FIX: &str = "derive an idempotency key from the scheduled time — the `batch.kubernetes.io/cronjob-scheduled-timestamp` annotation, which is set on the Job, not the Pod (read the Job through the API, or use the `batch.kubernetes.io/job-name` label, whose suffix is the scheduled minute) — and record it under a unique constraint before any side effect";

/// Removes the ` at line L column C` a `serde_yaml_ng` message carries (the
/// line is reported separately).
fn yaml_message(e: &serde_yaml_ng::Error) -> String {
    let s = e.to_string();
    match s.find(" at line ") {
        Some(i) => {
            let rest = &s[i + " at line ".len()..];
            let end = rest
                .find(',')
                .map_or(s.len(), |j| i + " at line ".len() + j);
            format!("{}{}", &s[..i], &s[end..])
        }
        None => s,
    }
}

/// Audits the CronJobs of a manifest file: the per-object findings, and the
/// schedules for the rules that look across files.
pub(crate) fn audit_manifests(
    file_idx: usize,
    file: &str,
    text: &str,
) -> Result<(Vec<Finding>, Vec<Scheduled>), AuditError> {
    let mut findings = Vec::new();
    let mut scheduled = Vec::new();
    for doc in split_documents(text) {
        let yaml_err = |e: serde_yaml_ng::Error| {
            let line = e.location().map_or(doc.first_line, |l| l.line());
            AuditError::parse(file, line, format!("invalid YAML: {}", yaml_message(&e)))
        };
        let mut value: Value = serde_yaml_ng::from_str(&doc.padded).map_err(yaml_err)?;
        // Resolve `<<: *anchor` merge keys, so merged fields count.
        value.apply_merge().map_err(yaml_err)?;
        let mut objects: Vec<(String, &Value)> = Vec::new();
        if let Some(items) = value.get("items").and_then(Value::as_sequence) {
            if value
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List"))
            {
                objects.extend(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| (format!("items.{i}."), v)),
                );
            }
        }
        objects.push((String::new(), &value));
        for (prefix, obj) in objects {
            let is_cronjob = obj.get("kind").and_then(Value::as_str) == Some("CronJob")
                && obj
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .is_some_and(|a| a.starts_with("batch/"));
            if is_cronjob {
                let cj = CronJob {
                    file,
                    doc: &doc,
                    prefix: &prefix,
                    obj,
                };
                let (f, s) = cj.audit(file_idx)?;
                findings.extend(f);
                scheduled.push(s);
            }
        }
    }
    Ok((findings, scheduled))
}

struct CronJob<'a> {
    file: &'a str,
    doc: &'a Document,
    prefix: &'a str,
    obj: &'a Value,
}

fn path_get<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.')
        .try_fold(v, |v, k| match k.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(k),
        })
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_sequence)
        .map(|s| {
            s.iter()
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    other => serde_yaml_ng::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

impl CronJob<'_> {
    /// The line of a key path under this object, else of its nearest
    /// ancestor, else of the object's `kind:`.
    fn line(&self, path: &str) -> usize {
        let kind_line = self
            .doc
            .keys
            .nearest(&format!("{}kind", self.prefix), self.doc.first_line);
        self.doc
            .keys
            .nearest(&format!("{}{path}", self.prefix), kind_line)
    }

    fn has_line(&self, path: &str) -> Option<usize> {
        self.doc.keys.get(&format!("{}{path}", self.prefix))
    }

    fn err(&self, path: &str, message: String) -> AuditError {
        AuditError::parse(self.file, self.line(path), message)
    }

    fn get(&self, path: &str) -> Option<&Value> {
        path_get(self.obj, path).filter(|v| !v.is_null())
    }

    fn str_field(&self, path: &str) -> Result<Option<String>, AuditError> {
        match self.get(path) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.err(path, format!("`{path}` must be a string"))),
        }
    }

    fn int_field(&self, path: &str) -> Result<Option<i64>, AuditError> {
        match self.get(path) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.err(path, format!("`{path}` must be an integer"))),
        }
    }

    /// Audits the CronJob: a table of named steps, each reading the fields
    /// it is about and adding its findings, in the order they are written.
    fn audit(&self, file_idx: usize) -> Result<(Vec<Finding>, Scheduled), AuditError> {
        let name = self
            .str_field("metadata.name")?
            .ok_or_else(|| self.err("metadata", "CronJob without metadata.name".into()))?;
        let namespace = self
            .str_field("metadata.namespace")?
            .unwrap_or_else(|| "default".into());
        let object = format!("{namespace}/{name}");
        let mut findings = Vec::new();
        let (schedule, schedule_zone) = self.schedule(&object)?;
        let zone = self.zone(&object, schedule_zone, &mut findings)?;
        let policy = self.concurrency_policy(&object, &mut findings)?;
        self.unkeyed_repeats(&name, &object, policy.as_deref(), &mut findings)?;
        self.starting_deadline(&object, &mut findings)?;
        let (entry, entry_line) = self.entry_point()?;
        let scheduled = Scheduled {
            file_idx,
            file: self.file.to_owned(),
            object,
            origin: Origin::CronJob,
            line: self.line("spec.schedule"),
            schedule,
            zone,
            entry,
            entry_line,
        };
        Ok((findings, scheduled))
    }

    /// `spec.schedule`, with the zone it may carry as a `CRON_TZ=`/`TZ=`
    /// prefix (as written, and parsed).
    fn schedule(&self, object: &str) -> Result<(Schedule, Option<(String, Tz)>), AuditError> {
        let raw = self
            .str_field("spec.schedule")?
            .ok_or_else(|| self.err("spec", format!("CronJob {object} has no spec.schedule")))?;
        let mut expr = raw.trim();
        let mut schedule_zone: Option<(String, Tz)> = None;
        for prefix in ["CRON_TZ=", "TZ="] {
            if let Some(rest) = expr.strip_prefix(prefix) {
                let (zone, sched) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                let tz: Tz = zone.parse().map_err(|_| {
                    self.err(
                        "spec.schedule",
                        format!("unknown time zone {zone:?} in schedule"),
                    )
                })?;
                schedule_zone = Some((format!("{prefix}{zone}"), tz));
                expr = sched.trim();
            }
        }
        let schedule = Schedule::parse(expr, false, true)
            .map_err(|e| self.err("spec.schedule", format!("CronJob {object}: {e}")))?;
        Ok((schedule, schedule_zone))
    }

    /// The zone the schedule is read in (`spec.timeZone`, else the
    /// schedule's prefix, else UTC), and `missing-timezone` when the
    /// manifest does not set it the supported way.
    fn zone(
        &self,
        object: &str,
        schedule_zone: Option<(String, Tz)>,
        findings: &mut Vec<Finding>,
    ) -> Result<Tz, AuditError> {
        let time_zone = match self.str_field("spec.timeZone")? {
            Some(z) => Some(z.parse::<Tz>().map_err(|_| {
                self.err(
                    "spec.timeZone",
                    format!("unknown time zone {z:?} (expected an IANA name)"),
                )
            })?),
            None => None,
        };
        let zone = time_zone
            .or(schedule_zone.as_ref().map(|z| z.1))
            .unwrap_or(Tz::UTC);
        match (time_zone, &schedule_zone) {
            (None, None) => findings.push(Finding::new(
                Rule::MissingTimezone,
                self.file,
                self.line("spec"),
                object,
                "No timeZone is set, so the schedule is read in the kube-controller-manager's zone, which the manifest does not show and a control-plane change can move.",
                "Set `spec.timeZone` to an IANA name (e.g. `Etc/UTC`, or the zone the business hours are in).",
            )),
            (None, Some((tz_text, _))) => findings.push(Finding::new(
                Rule::MissingTimezone,
                self.file,
                self.line("spec.schedule"),
                object,
                format!("The zone is given as `{tz_text}` inside the schedule, which Kubernetes 1.27+ rejects and older versions support only unofficially."),
                "Move the zone to `spec.timeZone` and keep `spec.schedule` to the five cron fields.",
            )),
            _ => {}
        }
        Ok(zone)
    }

    /// `spec.concurrencyPolicy` as written, and `concurrency-allow` when it
    /// lets two Jobs run at once.
    fn concurrency_policy(
        &self,
        object: &str,
        findings: &mut Vec<Finding>,
    ) -> Result<Option<String>, AuditError> {
        let policy = self.str_field("spec.concurrencyPolicy")?;
        match policy.as_deref() {
            None | Some("Allow") | Some("Forbid") | Some("Replace") => {}
            Some(other) => {
                return Err(self.err(
                    "spec.concurrencyPolicy",
                    format!(
                        "unknown concurrencyPolicy {other:?} (expected Allow, Forbid or Replace)"
                    ),
                ))
            }
        }
        if matches!(policy.as_deref(), None | Some("Allow")) {
            let what = if policy.is_none() {
                "concurrencyPolicy is absent (it defaults to Allow)"
            } else {
                "concurrencyPolicy is Allow"
            };
            findings.push(Finding::new(
                Rule::ConcurrencyAllow,
                self.file,
                self.has_line("spec.concurrencyPolicy")
                    .unwrap_or(self.line("spec")),
                object,
                format!("{what}, so when a run is still going at the next scheduled time (or a missed run is caught up), two Jobs of this CronJob run at once and both perform the side effects."),
                format!("Set `concurrencyPolicy: Forbid`, and {KEY_FIX}."),
            ));
        }
        Ok(policy)
    }

    /// What the pod's containers say about a guard: their command, args and
    /// env, and the field paths their env and downward-API volumes read.
    fn guard_signals(&self) -> GuardSignals {
        let mut texts = Vec::new();
        let mut field_paths = Vec::new();
        for list in ["containers", "initContainers"] {
            let Some(cs) = self
                .get(&format!("{POD}.{list}"))
                .and_then(Value::as_sequence)
            else {
                continue;
            };
            for c in cs {
                texts.extend(strings(c.get("command")));
                texts.extend(strings(c.get("args")));
                for e in c
                    .get("env")
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                {
                    for k in ["name", "value"] {
                        if let Some(s) = e.get(k).and_then(Value::as_str) {
                            texts.push(s.to_owned());
                        }
                    }
                    if let Some(p) =
                        path_get(e, "valueFrom.fieldRef.fieldPath").and_then(Value::as_str)
                    {
                        field_paths.push(p.to_owned());
                    }
                }
            }
        }
        for v in self
            .get(&format!("{POD}.volumes"))
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            for item in path_get(v, "downwardAPI.items")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
            {
                if let Some(p) = path_get(item, "fieldRef.fieldPath").and_then(Value::as_str) {
                    field_paths.push(p.to_owned());
                }
            }
        }
        GuardSignals::read(&texts, &field_paths)
    }

    /// Without a key derived from the scheduled time, a second run for the
    /// same time repeats the effects: `serial-duplicates` when the only
    /// guard stops overlaps alone, `retries-repeat-effects` when a failed
    /// pod is run again.
    fn unkeyed_repeats(
        &self,
        name: &str,
        object: &str,
        policy: Option<&str>,
        findings: &mut Vec<Finding>,
    ) -> Result<(), AuditError> {
        let guard = self.guard_signals();
        if guard.key.is_some() {
            return Ok(());
        }
        let pod_note = if guard.pod_annotation_ref {
            ", and the env that reads `batch.kubernetes.io/cronjob-scheduled-timestamp` from the Pod's annotations is empty because only the Job carries that annotation"
        } else {
            ""
        };
        let only_guard = match (policy, &guard.lock) {
            (Some(p @ ("Forbid" | "Replace")), _) => {
                Some((format!("concurrencyPolicy: {p}"), "the policy"))
            }
            (_, Some(lock)) => Some((format!("a lock ({lock})"), "the lock")),
            _ => None,
        };
        if let Some((only_guard, keep)) = only_guard {
            findings.push(Finding::new(
                Rule::SerialDuplicates,
                self.file,
                self.has_line("spec.concurrencyPolicy")
                    .unwrap_or(self.line("spec")),
                object,
                format!("The only guard is {only_guard}, which stops overlapping runs but not a second run for the same scheduled time after the first ended, such as a retried pod, `kubectl create job --from=cronjob/{name}` or a re-created CronJob catching up{pod_note}."),
                format!("Keep {keep} as an optimization, and {KEY_FIX}."),
            ));
        }
        findings.extend(self.retries(object, pod_note)?);
        Ok(())
    }

    /// `retries-repeat-effects` when `backoffLimit` (default 6) or
    /// `restartPolicy: OnFailure` runs a failed pod again.
    fn retries(&self, object: &str, pod_note: &str) -> Result<Option<Finding>, AuditError> {
        let backoff = self.int_field("spec.jobTemplate.spec.backoffLimit")?;
        let restart = self.str_field(&format!("{POD}.restartPolicy"))?;
        let effective = backoff.unwrap_or(DEFAULT_BACKOFF_LIMIT);
        let on_failure = restart.as_deref() == Some("OnFailure");
        if effective <= 0 && !on_failure {
            return Ok(None);
        }
        let mut why = Vec::new();
        if effective > 0 {
            why.push(match backoff {
                Some(b) => format!("backoffLimit: {b}"),
                None => format!("backoffLimit (absent, so {DEFAULT_BACKOFF_LIMIT})"),
            });
        }
        if on_failure {
            why.push("restartPolicy: OnFailure".to_owned());
        }
        let line = match (backoff, on_failure) {
            (Some(b), _) if b > 0 => self.line("spec.jobTemplate.spec.backoffLimit"),
            (_, true) => self.line(&format!("{POD}.restartPolicy")),
            _ => self.line("spec.jobTemplate.spec"),
        };
        Ok(Some(Finding::new(
            Rule::RetriesRepeatEffects,
            self.file,
            line,
            object,
            format!("{} {} a failed pod from the start without a key derived from the scheduled time{pod_note}, so whatever it did before failing is done again.", why.join(" and "), if why.len() > 1 { "re-run" } else { "re-runs" }),
            format!("Set `backoffLimit: 0` with `restartPolicy: Never`, or {KEY_FIX}, then allow retries."),
        )))
    }

    /// `missing-deadline` or `short-deadline` from
    /// `spec.startingDeadlineSeconds`.
    fn starting_deadline(
        &self,
        object: &str,
        findings: &mut Vec<Finding>,
    ) -> Result<(), AuditError> {
        match self.int_field("spec.startingDeadlineSeconds")? {
            None => findings.push(Finding::new(
                Rule::MissingDeadline,
                self.file,
                self.line("spec"),
                object,
                "No startingDeadlineSeconds: after controller downtime or a suspend the controller starts only the latest missed run, however late, or none at all once more than 100 were missed.",
                "Set `startingDeadlineSeconds` to how late a run is still useful (e.g. 300), and alert on runs that were skipped.",
            )),
            Some(n) if n < 10 => findings.push(Finding::new(
                Rule::ShortDeadline,
                self.file,
                self.line("spec.startingDeadlineSeconds"),
                object,
                format!("startingDeadlineSeconds: {n} is under 10 s, and the controller checks schedules only about every 10 s, so runs can be skipped as missed."),
                "Set `startingDeadlineSeconds` to at least 10, realistically a few minutes (e.g. 300).",
            )),
            Some(_) => {}
        }
        Ok(())
    }

    /// What the first container runs (for the shared-entry-point rule) and
    /// the line to report it on: `command:`, else `args:`, else `image:`,
    /// else the schedule's.
    fn entry_point(&self) -> Result<(Option<EntryPoint>, usize), AuditError> {
        let c0 = format!("{POD}.containers.0");
        let image = self.str_field(&format!("{c0}.image"))?;
        let mut argv = strings(self.get(&format!("{c0}.command")));
        argv.extend(strings(self.get(&format!("{c0}.args"))));
        let argv = if argv.len() == 1 {
            normalize_argv(&shell_words(&argv[0]))
        } else {
            normalize_argv(&argv)
        };
        let mut env: Vec<String> = self
            .get(&format!("{c0}.env"))
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .filter_map(|e| {
                Some(format!(
                    "{}={}",
                    e.get("name")?.as_str()?,
                    e.get("value")?.as_str()?
                ))
            })
            .collect();
        env.sort();
        let entry = image.map(|i| EntryPoint {
            image: Some(image_repo(&i)),
            argv,
            env,
        });
        let entry_line = ["command", "args", "image"]
            .iter()
            .find_map(|k| self.has_line(&format!("{c0}.{k}")))
            .unwrap_or(self.line("spec.schedule"));
        Ok((entry, entry_line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> Vec<(Rule, usize)> {
        let (f, _) = audit_manifests(0, "t.yaml", text).unwrap();
        let mut v: Vec<(Rule, usize)> = f.iter().map(|f| (f.rule, f.line)).collect();
        v.sort();
        v
    }

    const MINIMAL: &str = "\
apiVersion: batch/v1
kind: CronJob
metadata:
  name: m
spec:
  schedule: \"*/10 * * * *\"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
          - name: m
            image: busybox:1.36
            command: [\"sh\", \"-c\", \"wget -q http://svc/run\"]
";

    #[test]
    fn defaults_are_findings() {
        assert_eq!(
            rules(MINIMAL),
            vec![
                (Rule::ConcurrencyAllow, 5),
                (Rule::MissingDeadline, 5),
                (Rule::RetriesRepeatEffects, 8),
                (Rule::MissingTimezone, 5),
            ]
        );
        let (_, s) = audit_manifests(0, "t.yaml", MINIMAL).unwrap();
        assert_eq!(s[0].object, "default/m");
        assert_eq!(s[0].line, 6);
        assert_eq!(s[0].entry_line, 15);
        let e = s[0].entry.as_ref().unwrap();
        assert_eq!(e.image.as_deref(), Some("busybox"));
        assert_eq!(e.argv, ["wget", "-q", "http://svc/run"]);
    }

    #[test]
    fn lists_and_schedule_zones() {
        let text = "\
apiVersion: v1
kind: List
items:
- apiVersion: batch/v1
  kind: CronJob
  metadata: {name: a, namespace: ops}
  spec:
    schedule: \"CRON_TZ=Europe/Berlin 0 4 * * *\"
    concurrencyPolicy: Forbid
    startingDeadlineSeconds: 5
    jobTemplate:
      spec:
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            containers:
            - {name: a, image: app, args: [\"--idempotency-key-from-job\"]}
";
        assert_eq!(
            rules(text),
            vec![(Rule::ShortDeadline, 10), (Rule::MissingTimezone, 8)]
        );
        let (f, s) = audit_manifests(0, "t.yaml", text).unwrap();
        assert_eq!(f[0].object, "ops/a");
        assert_eq!(s[0].zone, chrono_tz::Europe::Berlin);
    }

    #[test]
    fn merge_keys_and_env_parameters_count() {
        let text = "\
x-defaults: &defaults
  concurrencyPolicy: Forbid
  startingDeadlineSeconds: 60
  timeZone: Etc/UTC
apiVersion: batch/v1
kind: CronJob
metadata: {name: r}
spec:
  <<: *defaults
  schedule: \"0 5 * * *\"
  jobTemplate:
    spec:
      backoffLimit: 0
      template:
        spec:
          containers:
          - name: r
            image: reports:1
            args: [report]
            env:
            - {name: REPORT, value: sales}
            - {name: IDEMPOTENCY_KEY_FROM, value: job-name}
";
        let (f, s) = audit_manifests(0, "t.yaml", text).unwrap();
        assert!(f.is_empty(), "{f:?}");
        let e = s[0].entry.as_ref().unwrap();
        assert_eq!(e.env, ["IDEMPOTENCY_KEY_FROM=job-name", "REPORT=sales"]);
        let other = EntryPoint {
            env: vec![
                "IDEMPOTENCY_KEY_FROM=job-name".into(),
                "REPORT=traffic".into(),
            ],
            ..e.clone()
        };
        assert!(!e.same_as(Origin::CronJob, &other, Origin::CronJob));
        assert!(e.same_as(Origin::CronJob, &e.clone(), Origin::CronJob));
    }

    #[test]
    fn invalid_values_are_errors_with_lines() {
        let bad_policy = MINIMAL.replace(
            "spec:\n  schedule",
            "spec:\n  concurrencyPolicy: Sometimes\n  schedule",
        );
        let e = audit_manifests(0, "t.yaml", &bad_policy).unwrap_err();
        assert_eq!(e.line(), Some(6));
        let bad_sched = MINIMAL.replace("*/10 * * * *", "*/10 * * *");
        let e = audit_manifests(0, "t.yaml", &bad_sched).unwrap_err();
        assert_eq!(e.line(), Some(6));
        assert!(e.to_string().contains("expected 5 fields"), "{e}");
        let bad_tz = MINIMAL.replace(
            "spec:\n  schedule",
            "spec:\n  timeZone: Europe/Atlantis\n  schedule",
        );
        let e = audit_manifests(0, "t.yaml", &bad_tz).unwrap_err();
        assert_eq!(e.line(), Some(6));
        let e = audit_manifests(0, "t.yaml", "a: 1\n---\nkind: [\n").unwrap_err();
        assert_eq!(e.line(), Some(4));
        assert!(!e.to_string().contains(" at line "), "{e}");
    }
}
