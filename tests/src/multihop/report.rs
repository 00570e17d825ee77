//! The multi-hop benchmark's markdown tables, progress lines and SVG plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::sampler::Sample;
use super::{ApiReport, MultihopResult, RunResult, Suite, LEVEL_ALL_OPEN};

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn secs(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.1} s"))
}

/// How E's cache followed the cuts of X's route level: "n cuts, median m s, max x s".
fn follows(lags: &[f64]) -> String {
    if lags.is_empty() {
        return "no cut".into();
    }
    let mut sorted = lags.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let max = sorted[sorted.len() - 1];
    format!("{} cuts in median {median:.2} s, max {max:.2} s", lags.len())
}

fn classes(r: &ApiReport) -> String {
    r.classes.iter().map(|c| format!("{:.1}", c.success * 100.0)).collect::<Vec<_>>().join(" / ")
}

fn ideal_classes(r: &ApiReport) -> String {
    r.classes
        .iter()
        .map(|c| format!("{:.0}", c.ideal_success * 100.0))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The failed requests' places, most frequent first ("e-door 812, timeout 3").
fn places(r: &ApiReport, top: usize) -> String {
    places_of(&r.places, top)
}

/// As [`places`], for any tally of places (one class's).
fn places_of(places: &BTreeMap<String, u64>, top: usize) -> String {
    let mut v: Vec<(&String, &u64)> = places.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    if v.is_empty() {
        return "-".into();
    }
    let mut parts: Vec<String> = v.iter().take(top).map(|(p, n)| format!("{p} {n}")).collect();
    let rest: u64 = v.iter().skip(top).map(|(_, n)| **n).sum();
    if rest > 0 {
        parts.push(format!("other {rest}"));
    }
    parts.join(", ")
}

fn suite_name(r: &RunResult) -> String {
    match r.suite {
        Suite::Steady => format!("steady {:.1}x", r.multiple),
        Suite::Mk => format!("M^k {:.1}x", r.multiple),
        Suite::Step => format!("step to {:.1}x", r.multiple),
        Suite::Retry => format!("retry {:.1}x", r.multiple),
    }
}

/// One line per finished run.
pub fn progress_line(r: &RunResult) -> String {
    let mut line = format!(
        "{:<14} k={} {:<15} goodput {:>5.1}/{:.0} rps ({:>5.1}% of ideal); X {} (c/n/b {}), Y {}; X refused at entry {}; wasted at A {}",
        suite_name(r),
        r.k,
        r.contender,
        r.goodput_rps,
        r.ideal.total(),
        r.goodput_ratio * 100.0,
        pct(r.x.success),
        classes(&r.x),
        pct(r.y.success),
        r.x.refused_at_entry().map_or("-".into(), pct),
        pct(r.work.a_wasted_share()),
    );
    let _ = write!(
        line,
        "; wasted upstream {}; X {:+.1} pp of f_sat/f {}",
        pct(r.work.upstream_wasted_share()),
        (r.x.success - r.x_success_target) * 100.0,
        pct(r.x_success_target),
    );
    if let Some(s) = &r.sidecars {
        let _ = write!(
            line,
            "; sidecars E {:.0}/{:.0} A {:.0}/{:.0} B {:.0} C {:.0} (door/egress); B refused {} of received",
            s.e_door,
            s.e_egress,
            s.a_door,
            s.a_egress,
            s.b_door,
            s.c_door,
            pct(s.b_refused_share())
        );
    }
    if r.retries {
        let _ = write!(
            line,
            "; attempts/request {:.2}, calls reaching B / needed {:.2}",
            r.attempts.attempts as f64 / r.attempts.requests.max(1) as f64,
            r.attempts.b_per_needed_call
        );
    }
    if let Some(s) = &r.step {
        let l = &s.levels;
        let _ = write!(
            line,
            "; settle {} recovery {}; B cut {} after the step, E's cache {} after B; B open {} after the drop, E's cache {} after B",
            secs(s.settle_secs),
            secs(s.recovery_secs),
            secs(l.b_cut_after_step),
            secs(l.e_sees_cut),
            secs(l.b_open_after_drop),
            secs(l.e_sees_open),
        );
        let _ = write!(
            line,
            "; X's route at A cut {} after the step, E's cache {} after it; open {} after the drop, E's cache {} after it; E follows {}; E looser {}",
            secs(l.route_cut_after_step),
            secs(l.e_sees_route_cut),
            secs(l.route_open_after_drop),
            secs(l.e_sees_route_open),
            follows(&l.e_follows_route_cuts),
            l.e_looser_share.map_or("-".into(), pct),
        );
    }
    let _ = write!(line, "; X failed at: {}", places(&r.x, 4));
    line
}

/// The markdown of a run of the benchmark.
pub fn markdown(r: &MultihopResult) -> String {
    let mut s = String::new();
    let c = &r.config;
    let a = &c.apps;
    let _ = writeln!(
        s,
        "Apps: E (gateway) {} workers; A {} workers, {:.0} ms of work each plus its calls; \
         B {} x {:.0} ms = {:.0} rps (the bottleneck); C {} x {:.0} ms = {:.0} rps (healthy). \
         X: A calls B k times in sequence; Y: A calls C once; Y offered {:.0} rps in every run; \
         mix {:.0}/{:.0}/{:.0} (critical/normal/background) for both APIs, {} users, {} ms budget \
         per attempt. Loads are X's calls at B as multiples of B's capacity. weir: shipped \
         defaults plus the graph's listeners, E's table and secret, `egress.enabled` where the \
         contender has it, `threads: 1` per role. HAProxy: `maxconn` = the app's workers.\n",
        a.e_workers,
        a.a_workers,
        a.a_work.as_secs_f64() * 1e3,
        a.b.workers,
        a.b.service_time.as_secs_f64() * 1e3,
        a.b.nominal_capacity(),
        a.c.workers,
        a.c.service_time.as_secs_f64() * 1e3,
        a.c.nominal_capacity(),
        c.y_rps,
        c.mix[0] * 100.0,
        c.mix[1] * 100.0,
        c.mix[2] * 100.0,
        c.users,
        c.budget.as_millis(),
    );
    let _ = writeln!(
        s,
        "Ideal: X at min(offered, B's capacity / k) plus Y at min(offered, C's capacity), \
         bounded by A's workers (X holds one for A's work + k x B's service time, Y for A's \
         work + C's; the cheaper API first if they do not fit); X's classes in priority order. \
         Wasted upstream work: A's and C's worker-seconds spent on requests that failed later \
         or finished after their deadline, over all their worker-seconds.\n"
    );
    for line in &r.skipped {
        let _ = writeln!(s, "- skipped: {line}");
    }
    if !r.skipped.is_empty() {
        s.push('\n');
    }
    s.push_str(&must_show(r));

    let steady: Vec<&RunResult> = r.runs.iter().filter(|x| x.suite == Suite::Steady).collect();
    if !steady.is_empty() {
        let _ = writeln!(
            s,
            "#### Steady loads, k = {}, {} s runs after a {:.0} s lead-in at 0.5x, first {} s of the load not counted\n",
            c.k,
            c.run.as_secs(),
            c.lead_in.as_secs_f64(),
            c.warmup.as_secs()
        );
        let _ = writeln!(
            s,
            "| contender | load | goodput / ideal | X success c / n / b (ideal) | Y success | X refusals at E (door + egress) | sidecars: refused at E door / E egress / A door / A egress / B / C | B refused of received | app B's peak inside ({} workers) | wasted upstream (A / C) | X ok p50 / p99 | vs inbound-only |\n\
             |---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|",
            a.b.workers
        );
        for x in &steady {
            let inbound = steady
                .iter()
                .find(|y| y.contender == "inbound-only" && (y.multiple - x.multiple).abs() < 1e-9);
            let vs = inbound
                .filter(|i| i.goodput_rps > 0.0)
                .map_or("-".into(), |i| format!("{:.2}x", x.goodput_rps / i.goodput_rps));
            let sidecars = x.sidecars.as_ref().map_or("-".into(), |p| {
                format!(
                    "{:.0} / {:.0} / {:.0} / {:.0} / {:.0} / {:.0}",
                    p.e_door, p.e_egress, p.a_door, p.a_egress, p.b_door, p.c_door
                )
            });
            let b_refused = x.sidecars.as_ref().map_or("-".into(), |p| pct(p.b_refused_share()));
            let _ = writeln!(
                s,
                "| {} | {:.1}x | {:.0} / {:.0} rps ({}) | {} ({}) | {} | {} | {} | {} | {} | {} ({} / {}) | {} / {} ms | {} |",
                x.contender,
                x.multiple,
                x.goodput_rps,
                x.ideal.total(),
                pct(x.goodput_ratio),
                classes(&x.x),
                ideal_classes(&x.x),
                pct(x.y.success),
                x.x.refused_at_entry().map_or("-".into(), pct),
                sidecars,
                b_refused,
                x.work.b_peak_inside,
                pct(x.work.upstream_wasted_share()),
                pct(x.work.a_wasted_share()),
                pct(x.work.c_wasted / x.work.c_busy.max(1e-9)),
                x.x.ok_p50_ms.map_or("-".into(), |v| format!("{v:.0}")),
                x.x.ok_p99_ms.map_or("-".into(), |v| format!("{v:.0}")),
                vs,
            );
        }
        s.push_str(
            "\nWhere the failed requests ended (the clients' view: the place of each failed \
             request's last attempt, from the `x-weir-shed` labels the hops pass back; `*-door` \
             is weir's inbound (by that hop's own level) or HAProxy in front of that hop, \
             `*-door-route` weir's inbound by the level of the route's downstreams, \
             `*-door-deadline` the request's budget, `a-egress-b` A's egress, \
             `timeout` the client giving up, `a-late` A's own queue past the deadline), and each \
             weir sidecar's in-flight limit (median over the counted span, from `/metrics`) with \
             the longest queue seen in weir:\n\n\
             | contender | load | X | Y | in-flight limit E / A / B / C (max queued in weir) |\n|---|---:|---|---|---|\n",
        );
        for x in &steady {
            let limits = ["e", "a", "b", "c"]
                .iter()
                .map(|h| {
                    x.hops.get(*h).map_or("-".into(), |s| {
                        format!(
                            "{} ({})",
                            s.inflight_limit.map_or("-".into(), |v| format!("{v:.0}")),
                            s.queue_max.map_or("-".into(), |v| format!("{v:.0}"))
                        )
                    })
                })
                .collect::<Vec<_>>()
                .join(" / ");
            let _ = writeln!(
                s,
                "| {} | {:.1}x | {} | {} | {} |",
                x.contender,
                x.multiple,
                places(&x.x, 5),
                places(&x.y, 5),
                limits
            );
        }
        s.push('\n');
    }

    let mk: Vec<&RunResult> = r
        .runs
        .iter()
        .filter(|x| {
            x.suite == Suite::Mk
                || (x.suite == Suite::Steady && (x.multiple - c.mk_multiple).abs() < 1e-9)
        })
        .collect();
    if r.config.suites.contains(&Suite::Mk) && !mk.is_empty() {
        let _ = writeln!(
            s,
            "#### M^k: A calls B k times per X request, {:.1}x at B\n\n\
             f_sat/f: X's ideal success (B's capacity / k over X's offered rate, bounded by A's workers). \
             B's calls wasted: calls B served for X requests that failed anyway (a later call failed, or the answer came after the client's deadline). \
             X's top class failed at: where its failed requests' last attempts ended (`*-deadline`: its budget ran out in that sidecar's queue; `b-504`: in B's app).\n",
            c.mk_multiple
        );
        s.push_str(
            "| contender | k | X offered | X success | f_sat/f | difference | X success c / n / b | X's top class failed at | B calls wasted (of B's completed) | goodput / ideal | Y success |\n\
             |---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|\n",
        );
        let mut rows = mk.clone();
        rows.sort_by(|a, b| a.contender.cmp(&b.contender).then(a.k.cmp(&b.k)));
        for x in rows {
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} rps | {} | {} | {:+.1} pp | {} | {} | {} ({}) | {} | {} |",
                x.contender,
                x.k,
                x.x.offered_rps,
                pct(x.x.success),
                pct(x.x_success_target),
                (x.x.success - x.x_success_target) * 100.0,
                classes(&x.x),
                x.x.classes.first().map_or("-".into(), |c| places_of(&c.places, 4)),
                x.work.b_calls_wasted,
                pct(x.work.b_calls_wasted as f64 / x.work.b_completed.max(1) as f64),
                pct(x.goodput_ratio),
                pct(x.y.success),
            );
        }
        s.push('\n');
    }

    let steps: Vec<&RunResult> = r.runs.iter().filter(|x| x.suite == Suite::Step).collect();
    if !steps.is_empty() {
        let _ = writeln!(
            s,
            "#### Step {:?}x of the bottleneck (X; Y constant), {} s each\n\n\
             settle: from the step up until every 500 ms window serves >= 90% of the high phase's ideal; \
             recovery: from the step down until every API and class keeps >= 99% success; \
             levels from each sidecar's `/metrics` every 100 ms (weir refreshes its cached-level gauge \
             every 250 ms): B's own level, A's egress's cached level of B, E's egress's cached level of A; \
             'cut' = first refuses a class in use, 'open' = admits every class again and stays so; \
             the caches' times are counted from B's.\n",
            c.step,
            c.step_phase.as_secs()
        );
        s.push_str(
            "| contender | settle | recovery | high-phase goodput / ideal | X critical (high) | Y (high) | timeouts of refusals + timeouts (high) | B cuts after the step | A's cache of B: cut / open after B | E's cache of A: cut / open after B | B open after the drop |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for x in &steps {
            let Some(st) = &x.step else { continue };
            let l = &st.levels;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} |",
                x.contender,
                secs(st.settle_secs),
                secs(st.recovery_secs),
                pct(st.high_goodput_ratio),
                pct(st.high_x_top_success),
                pct(st.high_y_success),
                st.high_timeout_share.map_or("-".into(), pct),
                secs(l.b_cut_after_step),
                secs(l.a_sees_cut),
                secs(l.a_sees_open),
                secs(l.e_sees_cut),
                secs(l.e_sees_open),
                secs(l.b_open_after_drop),
            );
        }
        s.push_str(
            "\nThe transition E's cache must follow, whichever hop makes it: X's route level as A \
             advertises it, min(A's own level, A's cached level of B) (behind callers whose \
             caches refuse for it, B may never cut). 'E follows': every cut of it from the step up \
             until 1 s after the drop, and how long until E's cached level of A was at or under \
             it (a cut re-opened before E got there is not counted; the gauge E's cache is read \
             from is refreshed every 250 ms, the scrape every 100 ms); 'E looser': the high \
             phase's samples in which E's cache admitted more than the route level.\n\n\
             | contender | route cut after the step | E's cache: cut after it | route open after the drop | E's cache: open after it | E follows the route's cuts | E looser (high) |\n\
             |---|---:|---:|---:|---:|---|---:|\n",
        );
        for x in &steps {
            let Some(st) = &x.step else { continue };
            let l = &st.levels;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                x.contender,
                secs(l.route_cut_after_step),
                secs(l.e_sees_route_cut),
                secs(l.route_open_after_drop),
                secs(l.e_sees_route_open),
                follows(&l.e_follows_route_cuts),
                l.e_looser_share.map_or("-".into(), pct),
            );
        }
        s.push('\n');
    }

    let retries: Vec<&RunResult> = r.runs.iter().filter(|x| x.suite == Suite::Retry).collect();
    if !retries.is_empty() {
        let p = &c.retry;
        let _ = writeln!(
            s,
            "#### Clients that retry refusals, {:.1}x at B, k = {}\n\n\
             Up to {} retries of a refusal (503), each after the larger of `retry-after` and a backoff step \
             ({} ms doubling, at most {} ms), times a jitter in [1, 1.5), with the same `x-user-id`; \
             timeouts and 5xx errors are not retried. Calls reaching B: A's calls to B that crossed \
             the network (A's egress refusals excluded), over the calls the unique X requests needed \
             (k each). Against the same contender's run without retries at the same load.\n",
            c.retry_multiple,
            c.k,
            p.max_retries,
            p.base.as_millis(),
            p.cap.as_millis()
        );
        s.push_str(
            "| contender | goodput / ideal | vs no retries | attempts per request | calls reaching B / needed | X success c / n / b | Y success | X failed at (last attempt) |\n\
             |---|---:|---:|---:|---:|---|---:|---|\n",
        );
        for x in retries {
            let without = r.runs.iter().find(|y| {
                y.suite == Suite::Steady
                    && y.contender == x.contender
                    && (y.multiple - x.multiple).abs() < 1e-9
                    && y.k == x.k
            });
            let vs = without
                .filter(|w| w.goodput_rps > 0.0)
                .map_or("-".into(), |w| format!("{:.2}x", x.goodput_rps / w.goodput_rps));
            let _ = writeln!(
                s,
                "| {} | {:.0} / {:.0} rps ({}) | {} | {:.2} | {:.2} | {} | {} | {} |",
                x.contender,
                x.goodput_rps,
                x.ideal.total(),
                pct(x.goodput_ratio),
                vs,
                x.attempts.attempts as f64 / x.attempts.requests.max(1) as f64,
                x.attempts.b_per_needed_call,
                classes(&x.x),
                pct(x.y.success),
                places(&x.x, 4),
            );
        }
        s.push('\n');
    }
    s
}

/// The "must show" figures, one row per run: goodput against the ideal and against
/// propagation off (the inbound-only contender's run of the same suite, load, k and
/// retries), Y's success, X's top class, where X was refused, wasted upstream work, B's
/// refusals of what it received, X's success against f_sat/f, calls reaching B per needed
/// call, and (step) how soon E's cache follows B's cut and recovery.
fn must_show(r: &MultihopResult) -> String {
    let mut s = String::new();
    s.push_str(
        "#### Every run: the issue's figures\n\n\
         Goodput counts requests that succeeded inside the counted span (by completion time), \
         against the ideal and against propagation off (the inbound-only run of the same suite, \
         load, k and retries); X refusals at E: the share of X's refusals made at E's door or \
         egress; B refused: B's refusals over what reached B; X - f_sat/f: X's success less its \
         ideal; calls reaching B / needed: A's calls that crossed to B over the X requests x k; \
         E sees B: E's cached level of A cut / re-opened this long after B's own level (step).\n\n\
         | suite | k | contender | goodput / ideal | vs off | Y success | X top class | X refusals at E | wasted upstream | B refused | X - f_sat/f | calls reaching B / needed | E sees B cut / open |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for x in &r.runs {
        let off = r.runs.iter().find(|y| {
            y.contender == "inbound-only"
                && y.suite == x.suite
                && y.k == x.k
                && y.retries == x.retries
                && (y.multiple - x.multiple).abs() < 1e-9
        });
        let vs = off
            .filter(|o| o.goodput_rps > 0.0)
            .map_or("-".into(), |o| format!("{:.2}x", x.goodput_rps / o.goodput_rps));
        let top = x.x.classes.first().map_or("-".into(), |c| pct(c.success));
        let b = x.sidecars.as_ref().map_or("-".into(), |p| pct(p.b_refused_share()));
        let e_sees = x.step.as_ref().map_or("-".into(), |st| {
            format!("{} / {}", secs(st.levels.e_sees_cut), secs(st.levels.e_sees_open))
        });
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:+.1} pp | {:.2} | {} |",
            suite_name(x),
            x.k,
            x.contender,
            pct(x.goodput_ratio),
            vs,
            pct(x.y.success),
            top,
            x.x.refused_at_entry().map_or("-".into(), pct),
            pct(x.work.upstream_wasted_share()),
            b,
            (x.x.success - x.x_success_target) * 100.0,
            x.attempts.b_per_needed_call,
            e_sees,
        );
    }
    s.push('\n');
    s
}

// === plots ===

const PALETTE: [plotters::style::RGBColor; 6] = [
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(255, 127, 14),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(148, 103, 189),
    plotters::style::RGBColor(0, 0, 0),
];

/// The same colour for a contender in every plot.
fn color_of(contender: &str) -> plotters::style::RGBColor {
    let known = ["direct", "inbound-only", "one-hop-egress", "multihop", "haproxy"];
    PALETTE[known.iter().position(|k| *k == contender).unwrap_or(5)]
}

fn contenders(runs: &[&RunResult]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in runs {
        if !names.contains(&r.contender) {
            names.push(r.contender.clone());
        }
    }
    names
}

/// Writes `goodput.svg` (steady), `mk.svg` (M^k) and `step-<contender>.svg`; returns the
/// file names.
pub fn write_plots(r: &MultihopResult, dir: &Path) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let steady: Vec<&RunResult> = r.runs.iter().filter(|x| x.suite == Suite::Steady).collect();
    if !steady.is_empty() {
        goodput_plot(&steady, &dir.join("goodput.svg"))?;
        written.push("goodput.svg".to_string());
    }
    let mk: Vec<&RunResult> = r
        .runs
        .iter()
        .filter(|x| {
            x.suite == Suite::Mk
                || (x.suite == Suite::Steady && (x.multiple - r.config.mk_multiple).abs() < 1e-9)
        })
        .collect();
    if r.config.suites.contains(&Suite::Mk) && !mk.is_empty() {
        mk_plot(&mk, &dir.join("mk.svg"))?;
        written.push("mk.svg".to_string());
    }
    for x in r.runs.iter().filter(|x| x.suite == Suite::Step) {
        let name = format!("step-{}.svg", x.contender);
        step_plot(x, &dir.join(&name))?;
        written.push(name);
    }
    Ok(written)
}

fn goodput_plot(runs: &[&RunResult], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(crate::plot::err)?;
    let panels = root.split_evenly((2, 1));
    let x_max = runs.iter().map(|r| r.multiple).fold(1.0, f64::max) * 1.05;
    type Pick = fn(&RunResult) -> f64;
    let picks: [(&str, &str, Pick); 2] = [
        ("End-to-end goodput / ideal", "goodput / ideal", |r| r.goodput_ratio),
        ("API Y (avoids the bottleneck): success", "success", |r| r.y.success),
    ];
    for (panel, (caption, y_desc, pick)) in panels.iter().zip(picks) {
        let mut chart = crate::plot::panel_chart(
            panel,
            caption,
            ("offered load at B (x B's capacity)", 0f64..x_max),
            (y_desc, 0f64..1.1f64),
        )?;
        for name in contenders(runs) {
            let mut points: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| r.contender == name)
                .map(|r| (r.multiple, pick(r)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            crate::plot::line(&mut chart, points, &name, color_of(&name))?;
        }
        crate::plot::legend(&mut chart, SeriesLabelPosition::LowerLeft)?;
    }
    root.present().map_err(crate::plot::err)?;
    Ok(())
}

fn mk_plot(runs: &[&RunResult], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(crate::plot::err)?;
    let k_max = runs.iter().map(|r| r.k).max().unwrap_or(3) as f64 + 0.2;
    let mut chart = crate::plot::panel_chart(
        &root,
        "M^k: X success against f_sat/f",
        ("k (calls to B per X request)", 0.8f64..k_max),
        ("X success", 0f64..1.05f64),
    )?;
    for name in contenders(runs) {
        let mut points: Vec<(f64, f64)> = runs
            .iter()
            .filter(|r| r.contender == name)
            .map(|r| (r.k as f64, r.x.success))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        crate::plot::line(&mut chart, points, &name, color_of(&name))?;
    }
    let mut target: Vec<(f64, f64)> =
        runs.iter().map(|r| (r.k as f64, r.x_success_target)).collect();
    target.sort_by(|a, b| a.0.total_cmp(&b.0));
    target.dedup_by(|a, b| a.0 == b.0);
    crate::plot::line(&mut chart, target, "f_sat / f", RGBColor(127, 127, 127))?;
    crate::plot::legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(crate::plot::err)?;
    Ok(())
}

/// A hop's counter in a sample (0 when the hop has no sidecar or its scrape failed).
fn hop(s: &Sample, name: &str, f: fn(&super::sampler::HopMetrics) -> f64) -> f64 {
    s.hop(name).map_or(0.0, f)
}

/// A step run over time: levels (B's own, A's and E's cached, A's and E's own), refusals
/// per second by place (sidecars' counters), and what the clients got per second.
fn step_plot(r: &RunResult, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 1400)).into_drawing_area();
    root.fill(&WHITE).map_err(crate::plot::err)?;
    let panels = root.split_evenly((4, 1));
    let samples = &r.samples;
    let t_max = samples.last().map_or(1.0, |s| s.at_secs + 0.2);
    let level = |hop: &str, cached_of: Option<&str>| -> Vec<(f64, f64)> {
        samples
            .iter()
            .filter_map(|s| {
                let h = s.hop(hop)?;
                let v = match cached_of {
                    None => h.level?,
                    Some(a) => h.cached.get(a).copied().unwrap_or(32767.0),
                };
                Some((s.at_secs, v.min(LEVEL_ALL_OPEN) / 128.0))
            })
            .collect()
    };
    let auth = |hop: &str| r.authorities.get(hop).cloned().unwrap_or_default();
    let mut lines = vec![("B's level".to_string(), level("b", None))];
    if samples.iter().any(|s| s.hop("a").is_some_and(|h| !h.cached.is_empty())) {
        lines.push(("A's cached level of B".into(), level("a", Some(&auth("b")))));
    }
    if samples.iter().any(|s| s.hop("e").is_some_and(|h| !h.cached.is_empty())) {
        lines.push(("E's cached level of A".into(), level("e", Some(&auth("a")))));
    }
    lines.push(("A's level".into(), level("a", None)));
    lines.push(("E's level".into(), level("e", None)));
    lines.retain(|(_, v)| !v.is_empty());
    crate::plot::time_panel(
        &panels[0],
        &format!("{}: levels as B + U/128 (clamped at 2.99: every class admitted)", r.contender),
        "level",
        t_max,
        3.1,
        lines,
    )?;
    type Pick = fn(&Sample) -> f64;
    let rate = |f: Pick| -> Vec<(f64, f64)> {
        samples
            .windows(2)
            .map(|w| {
                let dt = (w[1].at_secs - w[0].at_secs).max(1e-3);
                (w[1].at_secs, (f(&w[1]) - f(&w[0])).max(0.0) / dt)
            })
            .collect()
    };
    let picks: [(&str, Pick); 6] = [
        ("E door", |s| hop(s, "e", |h| h.inbound_shed())),
        ("E egress", |s| hop(s, "e", |h| h.egress_shed())),
        ("A door", |s| hop(s, "a", |h| h.inbound_shed())),
        ("A egress", |s| hop(s, "a", |h| h.egress_shed())),
        ("B", |s| hop(s, "b", |h| h.inbound_shed())),
        ("calls A sent to B", |s| s.app_a.call("b").sent as f64),
    ];
    let lines: Vec<(String, Vec<(f64, f64)>)> =
        picks.iter().map(|(name, f)| (name.to_string(), rate(*f))).collect();
    let y = lines.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).fold(10.0, f64::max) * 1.1;
    crate::plot::time_panel(
        &panels[1],
        "refused per second by place (sidecars' counters), and A's calls to B",
        "per second",
        t_max,
        y,
        lines,
    )?;
    let x_ok = rate(|s| s.app_a.ok[0] as f64);
    let y_ok = rate(|s| s.app_a.ok[1] as f64);
    let b_done = rate(|s| s.b.completed as f64);
    let lines = vec![
        ("X served by A (ok)".to_string(), x_ok),
        ("Y served by A (ok)".to_string(), y_ok),
        ("B completed".to_string(), b_done),
    ];
    let y = lines.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).fold(10.0, f64::max) * 1.1;
    crate::plot::time_panel(&panels[2], "served per second", "per second", t_max, y, lines)?;
    let limit = |name: &str| -> Vec<(f64, f64)> {
        samples.iter().filter_map(|s| Some((s.at_secs, s.hop(name)?.inflight_limit?))).collect()
    };
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = ["e", "a", "b", "c"]
        .iter()
        .map(|h| (format!("{}'s in-flight limit", h.to_uppercase()), limit(h)))
        .collect();
    lines.retain(|(_, v)| !v.is_empty());
    let y = lines.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).fold(8.0, f64::max) * 1.1;
    crate::plot::time_panel(
        &panels[3],
        "in-flight limits (weir's /metrics)",
        "requests",
        t_max,
        y,
        lines,
    )?;
    root.present().map_err(crate::plot::err)?;
    Ok(())
}
