//! `top` on a terminal: a full screen redrawn in place (ratatui on crossterm's alternate screen),
//! the attribution first, in the spirit of nvitop and htop.
//!
//! - one row per GPU (memory used of total, SM busy, power, cost per hour, pods), the selected one
//!   highlighted;
//! - under it the selected GPU's lines: each pod's memory, SM share, power and cost per hour, then
//!   what belongs to no pod (driver reserved, unattributed, idle / free) and the total. Every
//!   column is rounded so that the printed lines add up to the printed total (largest remainder),
//!   as the attribution's integer lines add up to the device;
//! - a status line (guardrail violations, idle reservations, NVML or Kubernetes not ready) and the
//!   keys.
//!
//! Keys: ↑/↓ (k/j) choose the GPU, PgUp/PgDn scroll, `n` filters by namespace (the other
//! namespaces' pods become one line, so the totals still add up), `s` sorts (memory, SM, cost,
//! name), `p` pauses, `d` shows the details (the driver ledger per cgroup and process, violations),
//! `?` the help, `q` quits. Everything is drawn from one [`AgentSnapshot`]: the same view serves
//! this node's own probes and `--connect`.
use std::{
    cmp::Reverse,
    io,
    time::{Duration, Instant},
};

use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::{
    DefaultTerminal, Frame,
    layout::{Alignment, Constraint, Layout, Rect},
    style::{Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Clear, Paragraph, Row, Table, TableState, Wrap},
};
use tracer_core::{
    attribution::GpuAttribution,
    model::{AgentSnapshot, KubernetesStatus, NvmlStatus},
};

use super::{RenderOptions, render};

const MIB: u128 = 1 << 20;

/// How the pods of a GPU are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Memory,
    Sm,
    Cost,
    Name,
}

impl SortKey {
    fn next(self) -> Self {
        match self {
            SortKey::Memory => SortKey::Sm,
            SortKey::Sm => SortKey::Cost,
            SortKey::Cost => SortKey::Name,
            SortKey::Name => SortKey::Memory,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            SortKey::Memory => "memory",
            SortKey::Sm => "SM",
            SortKey::Cost => "cost",
            SortKey::Name => "name",
        }
    }
}

/// What the screen shows and how: the user's choices (keys, flags).
#[derive(Clone, Debug)]
pub struct View {
    /// Where the snapshots come from (`this node's probes`, `agent unix:///…`).
    pub source: String,
    /// How often a snapshot is taken.
    pub interval: Duration,
    /// Only this namespace's pods on their own lines (`--namespace`, `n`).
    pub namespace: Option<String>,
    /// Only GPUs whose index or UUID (prefix) is this (`--gpu`).
    pub gpu: Option<String>,
    /// The GPU chosen, among those shown.
    pub selected: usize,
    pub sort: SortKey,
    pub paused: bool,
    pub help: bool,
    pub details: bool,
    /// Rows scrolled (the pods, or the details).
    pub scroll: u16,
    /// The namespace being typed after `n`.
    pub input: Option<String>,
}

impl View {
    pub fn new(source: String, interval: Duration) -> Self {
        View {
            source,
            interval,
            namespace: None,
            gpu: None,
            selected: 0,
            sort: SortKey::Memory,
            paused: false,
            help: false,
            details: false,
            scroll: 0,
            input: None,
        }
    }

    /// Apply a key. `false`: quit.
    pub fn key(&mut self, k: KeyEvent) -> bool {
        if k.kind == KeyEventKind::Release {
            return true;
        }
        let ctrl_c = k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c');
        if ctrl_c {
            return false;
        }
        if let Some(text) = &mut self.input {
            match k.code {
                KeyCode::Enter => {
                    let ns = text.trim().to_string();
                    self.namespace = (!ns.is_empty()).then_some(ns);
                    self.input = None;
                    self.scroll = 0;
                }
                KeyCode::Esc => self.input = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) if !c.is_control() && text.len() < 63 => text.push(c),
                _ => {}
            }
            return true;
        }
        if self.help {
            self.help = false;
            return !matches!(k.code, KeyCode::Char('q'));
        }
        match k.code {
            KeyCode::Char('q') | KeyCode::Char('Q') => return false,
            KeyCode::Esc if self.details => self.details = false,
            KeyCode::Esc => return false,
            KeyCode::Up | KeyCode::Char('k') => {
                self.selected = self.selected.saturating_sub(1);
                self.scroll = 0;
            }
            KeyCode::Down | KeyCode::Char('j') => {
                self.selected += 1;
                self.scroll = 0;
            }
            KeyCode::PageDown | KeyCode::Char(' ') => self.scroll = self.scroll.saturating_add(5),
            KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(5),
            KeyCode::Home => self.scroll = 0,
            KeyCode::Char('n') | KeyCode::Char('/') => self.input = Some(self.namespace.clone().unwrap_or_default()),
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('p') => self.paused = !self.paused,
            KeyCode::Char('d') | KeyCode::Enter => {
                self.details = !self.details;
                self.scroll = 0;
            }
            KeyCode::Char('?') | KeyCode::Char('h') | KeyCode::F(1) => self.help = true,
            _ => {}
        }
        true
    }
}

/// The GPUs shown: the attribution's, in its order, filtered by `--gpu`.
fn gpus<'a>(s: &'a AgentSnapshot, v: &View) -> Vec<&'a GpuAttribution> {
    let Some(a) = &s.attribution else { return Vec::new() };
    a.gpus
        .iter()
        .filter(|g| match &v.gpu {
            None => true,
            Some(want) => {
                g.index.is_some_and(|i| i.to_string() == *want)
                    || g.uuid.starts_with(want.as_str())
                    || g.parent_uuid.as_deref().is_some_and(|p| p.starts_with(want.as_str()))
            }
        })
        .collect()
}

/// Integer parts in units of `unit` that add up to the sum of `values` rounded to the unit
/// (largest remainder), and that sum. What makes a printed column add up to its printed total.
fn apportion(values: &[u128], unit: u128) -> (Vec<u128>, u128) {
    if unit == 0 {
        return (vec![0; values.len()], 0);
    }
    let total: u128 = values.iter().sum();
    let target = (total + unit / 2) / unit;
    let mut out: Vec<u128> = values.iter().map(|v| v / unit).collect();
    let mut left = target.saturating_sub(out.iter().sum());
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by_key(|&i| (Reverse(values[i] % unit), i));
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    (out, target)
}

/// One line of a GPU's block before rounding: bytes, millipercent, millijoules, nano-currency.
struct Raw {
    name: String,
    memory: Option<u128>,
    sm: Option<u128>,
    energy: Option<u128>,
    cost: Option<u128>,
    launches: Option<u64>,
    pids: String,
}

/// A GPU's block, printed: each column's cells, which add up to the total row's.
pub struct Printed {
    pub title: String,
    /// (name, memory MiB, SM %, power W, cost per hour, launches, pids)
    pub rows: Vec<[String; 7]>,
    pub total: [String; 7],
    /// Memory used (total − free) and total, MiB; SM busy (100 − idle), %; power, W; cost per hour.
    pub used_mib: Option<u128>,
    pub total_mib: Option<u128>,
    pub busy: Option<String>,
    pub power: Option<String>,
    pub cost_per_hour: Option<String>,
    pub pods: usize,
}

fn fixed(v: u128, decimals: u32) -> String {
    let d = 10u128.pow(decimals);
    if decimals == 0 { v.to_string() } else { format!("{}.{:0w$}", v / d, v % d, w = decimals as usize) }
}

/// The selected GPU's lines, rounded so that every column adds up as printed.
pub fn printed(s: &AgentSnapshot, g: &GpuAttribution, v: &View) -> Printed {
    let interval_ns = s.attribution.as_ref().map_or(0, |a| a.interval_ns) as u128;
    let namespace_of =
        |key: u64| s.containers.get(&key).and_then(|c| c.namespace.clone()).unwrap_or_else(|| "-".into());
    let mut lines: Vec<Raw> = Vec::new();
    let mut others = Raw {
        name: String::new(),
        memory: Some(0),
        sm: Some(0),
        energy: g.energy.map(|_| 0),
        cost: g.cost.map(|_| 0),
        launches: Some(0),
        pids: String::new(),
    };
    let mut hidden = 0usize;
    for c in &g.containers {
        let raw = Raw {
            name: c.name.clone().unwrap_or_else(|| {
                s.containers
                    .get(&c.container.0)
                    .map_or_else(|| format!("cgroup {}", c.container.0), |i| i.display_name())
            }),
            memory: Some(c.memory_bytes.into()),
            sm: Some(c.sm_millipct.into()),
            energy: c.energy_mj.map(Into::into),
            cost: c.cost_nano.map(Into::into),
            launches: Some(c.launches),
            pids: c.pids.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        };
        if v.namespace.as_ref().is_some_and(|ns| *ns != namespace_of(c.container.0)) {
            hidden += 1;
            let add = |a: &mut Option<u128>, b: Option<u128>| *a = a.zip(b).map(|(a, b)| a + b).or(*a);
            add(&mut others.memory, raw.memory);
            add(&mut others.sm, raw.sm);
            add(&mut others.energy, raw.energy);
            add(&mut others.cost, raw.cost);
            others.launches = others.launches.map(|l| l + c.launches);
            continue;
        }
        lines.push(raw);
    }
    match v.sort {
        SortKey::Memory => lines.sort_by_key(|l| (Reverse(l.memory), l.name.clone())),
        SortKey::Sm => lines.sort_by_key(|l| (Reverse(l.sm), l.name.clone())),
        SortKey::Cost => lines.sort_by_key(|l| (Reverse(l.cost), l.name.clone())),
        SortKey::Name => lines.sort_by(|a, b| a.name.cmp(&b.name)),
    }
    let pods = lines.len();
    if hidden > 0 {
        others.name = format!("other namespaces ({hidden} pods)");
        lines.push(others);
    }
    let mem = g.memory;
    let none = |name: &str| Raw {
        name: name.into(),
        memory: None,
        sm: None,
        energy: None,
        cost: None,
        launches: None,
        pids: String::new(),
    };
    let mut reserved = none("driver reserved");
    reserved.memory = mem.map(|m| m.driver_reserved.into());
    reserved.cost = g.cost.map(|c| c.driver_reserved.into());
    let mut unattributed = none("unattributed");
    unattributed.memory = mem.map(|m| m.unattributed.into());
    unattributed.sm = Some(g.compute.unattributed.into());
    unattributed.energy = g.energy.map(|e| e.unattributed.into());
    unattributed.cost = g.cost.map(|c| c.unattributed.into());
    let mut idle = none("idle / free");
    idle.memory = mem.map(|m| m.free.into());
    idle.sm = Some(g.compute.idle.into());
    idle.energy = g.energy.map(|e| e.idle.into());
    idle.cost = g.cost.map(|c| c.idle.into());
    let first_remainder = lines.len();
    lines.extend([reserved, unattributed, idle]);

    // Each column apportioned over every line (a cell that does not apply counts 0).
    let column = |f: fn(&Raw) -> Option<u128>, scale: u128, unit: u128| -> Option<(Vec<u128>, u128)> {
        if lines.iter().all(|l| f(l).is_none()) || unit == 0 {
            return None;
        }
        let values: Vec<u128> = lines.iter().map(|l| f(l).unwrap_or(0) * scale).collect();
        Some(apportion(&values, unit))
    };
    let memory = column(|l| l.memory, 1, MIB);
    // 0.1 % of the interval: 100 millipercent.
    let sm = column(|l| l.sm, 1, 100);
    // Watts: millijoules per millisecond of the interval.
    let power = column(|l| l.energy, 1, interval_ns / 1_000_000);
    // Cents per hour: nano × 3600 s/h × 100 ¢ / (interval in ns).
    let cost = column(|l| l.cost, 360_000, interval_ns);
    let cell = |col: &Option<(Vec<u128>, u128)>, i: usize, f: fn(&Raw) -> Option<u128>, decimals: u32| match (
        col,
        f(&lines[i]),
    ) {
        (Some((parts, _)), Some(_)) => fixed(parts[i], decimals),
        _ => "-".to_string(),
    };
    let rows: Vec<[String; 7]> = (0..lines.len())
        .map(|i| {
            let l = &lines[i];
            [
                l.name.clone(),
                cell(&memory, i, |l| l.memory, 0),
                cell(&sm, i, |l| l.sm, 1),
                cell(&power, i, |l| l.energy, 0),
                cell(&cost, i, |l| l.cost, 2),
                l.launches.map_or("-".into(), |n| n.to_string()),
                l.pids.clone(),
            ]
        })
        .collect();
    let total_of = |col: &Option<(Vec<u128>, u128)>, decimals: u32| col.as_ref().map(|(_, t)| fixed(*t, decimals));
    let launches: u64 = g.containers.iter().map(|c| c.launches).sum();
    let total = [
        "total".to_string(),
        total_of(&memory, 0).unwrap_or_else(|| "-".into()),
        total_of(&sm, 1).unwrap_or_else(|| "-".into()),
        total_of(&power, 0).unwrap_or_else(|| "-".into()),
        total_of(&cost, 2).unwrap_or_else(|| "-".into()),
        launches.to_string(),
        String::new(),
    ];
    let free_at = first_remainder + 2;
    let used_mib = memory.as_ref().map(|(p, t)| t - p[free_at]);
    let busy = sm.as_ref().map(|(p, t)| fixed(t - p[free_at], 1));
    let mut title = format!("GPU {}", g.index.map_or("-".into(), |i| i.to_string()));
    if let Some(n) = &g.name {
        title.push_str(&format!(" · {n}"));
    }
    if let Some(p) = &g.mig_profile {
        title.push_str(&format!(" · MIG {p}"));
    }
    title.push_str(&format!(" · {} · {}", short_uuid(&g.uuid), g.sharing.as_str()));
    if g.lost {
        title.push_str(" · LOST");
    }
    Printed {
        title,
        rows,
        total,
        used_mib,
        total_mib: memory.as_ref().map(|(_, t)| *t),
        busy,
        power: total_of(&power, 0),
        cost_per_hour: total_of(&cost, 2),
        pods,
    }
}

fn short_uuid(u: &str) -> String {
    if u.len() > 16 { format!("{}…", &u[..15]) } else { u.to_string() }
}

/// What the status line says: violations, idle reservations, sources that are not ready.
fn status(s: &AgentSnapshot) -> Option<String> {
    let mut parts = Vec::new();
    if !s.violations.is_empty() {
        let v = &s.violations[s.violations.len() - 1];
        parts.push(format!(
            "! {} guardrail violation{}, latest {}/{}",
            s.violations.len(),
            if s.violations.len() == 1 { "" } else { "s" },
            v.namespace,
            v.pod
        ));
    }
    if let Some(a) = &s.attribution {
        let idle = a.containers.iter().filter(|c| c.idle_reservation.is_some()).count();
        if idle > 0 {
            parts.push(format!("{idle} idle reservation{}", if idle == 1 { "" } else { "s" }));
        }
    }
    if s.nvml.status != NvmlStatus::Ready && s.nvml.status != NvmlStatus::NotStarted {
        parts.push(format!("NVML {}", s.nvml.status));
    }
    if s.kubernetes.status == KubernetesStatus::Unavailable {
        parts.push(format!("kubernetes {}", s.kubernetes.status));
    }
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// Draw the whole screen.
pub fn draw(f: &mut Frame<'_>, s: Option<&AgentSnapshot>, v: &mut View) {
    let area = f.area();
    let st = s.and_then(status);
    let [head, body, stat, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(u16::from(st.is_some())),
        Constraint::Length(1),
    ])
    .areas(area);
    let mut flags = Vec::new();
    if v.paused {
        flags.push("PAUSED".to_string());
    }
    if let Some(ns) = &v.namespace {
        flags.push(format!("ns={ns}"));
    }
    if let Some(g) = &v.gpu {
        flags.push(format!("gpu={g}"));
    }
    flags.push(format!("sort={}", v.sort.as_str()));
    let now = s.and_then(|s| s.attribution.as_ref()).map(|a| {
        let secs = (a.start_unix_ns + a.interval_ns) / 1_000_000_000;
        format!("{:02}:{:02}:{:02} UTC", secs / 3600 % 24, secs / 60 % 60, secs % 60)
    });
    let flags = flags.join(" ");
    let tail = format!(" · {}every {:.1} s", now.map(|n| n + " · ").unwrap_or_default(), v.interval.as_secs_f64());
    // The source gives way first (a socket path can be long): the time and the flags stay.
    let room = (head.width as usize)
        .saturating_sub("gpu-tracer top · ".len() + tail.chars().count() + flags.chars().count() + 1);
    let source: String = if v.source.chars().count() <= room {
        v.source.clone()
    } else {
        let keep = room.saturating_sub(1);
        let skip = v.source.chars().count() - keep;
        format!("…{}", v.source.chars().skip(skip).collect::<String>())
    };
    let title = format!("gpu-tracer top · {source}{tail}");
    let pad = (head.width as usize).saturating_sub(title.chars().count() + flags.chars().count() + 1);
    f.render_widget(
        Paragraph::new(format!("{title}{} {flags}", " ".repeat(pad)))
            .style(Style::new().add_modifier(Modifier::REVERSED)),
        head,
    );
    if let Some(st) = st {
        f.render_widget(Paragraph::new(st).style(Style::new().add_modifier(Modifier::BOLD)), stat);
    }
    let keys = match &v.input {
        Some(t) => format!("namespace (empty: all): {t}▏  Enter apply · Esc cancel"),
        None if v.details => "↑↓ PgUp PgDn scroll  d/Esc back  ? help  q quit".into(),
        None => "↑↓ GPU  PgUp/Dn pods  n namespace  s sort  p pause  d details  ? help  q quit".into(),
    };
    f.render_widget(Paragraph::new(keys), foot);

    match s {
        None => f.render_widget(Paragraph::new("waiting for the first snapshot…"), body),
        Some(s) if v.details || s.attribution.is_none() => details(f, s, v, body),
        Some(s) => attribution(f, s, v, body),
    }
    if v.help {
        help(f, area);
    }
}

fn details(f: &mut Frame<'_>, s: &AgentSnapshot, v: &mut View, area: Rect) {
    let text = tracer_core::format::printable(&render(s, &RenderOptions { per_process: true, width: area.width }))
        .into_owned();
    let lines = text.lines().count() as u16;
    v.scroll = v.scroll.min(lines.saturating_sub(area.height));
    f.render_widget(Paragraph::new(text).scroll((v.scroll, 0)), area);
}

fn attribution(f: &mut Frame<'_>, s: &AgentSnapshot, v: &mut View, area: Rect) {
    let gs = gpus(s, v);
    if gs.is_empty() {
        let why = match &v.gpu {
            Some(g) => format!("no GPU matches --gpu {g}"),
            None => "no GPU in the attribution".into(),
        };
        f.render_widget(Paragraph::new(why), area);
        return;
    }
    v.selected = v.selected.min(gs.len() - 1);
    let blocks: Vec<Printed> = gs.iter().map(|g| printed(s, g, v)).collect();
    // The GPU table: every GPU when there is room, else a window around the selected one.
    let gpu_rows = (gs.len() as u16).min((area.height / 2).max(2).saturating_sub(1)).max(1);
    let [gpu_area, pod_area] = Layout::vertical([Constraint::Length(gpu_rows + 1), Constraint::Min(0)]).areas(area);
    let wide = area.width >= 110;
    let header = Row::new(["GPU", "MODEL", "USED/TOTAL MiB", "SM BUSY %", "W", "COST/h", "PODS"])
        .style(Style::new().add_modifier(Modifier::BOLD));
    let rows = gs.iter().zip(&blocks).map(|(g, b)| {
        Row::new([
            g.index.map_or("-".into(), |i| i.to_string()) + g.mig_profile.as_ref().map_or("", |_| " MIG"),
            g.name.clone().unwrap_or_else(|| short_uuid(&g.uuid)),
            match (b.used_mib, b.total_mib) {
                (Some(u), Some(t)) => format!("{u}/{t}"),
                _ => "-".into(),
            },
            b.busy.clone().unwrap_or_else(|| "-".into()),
            b.power.clone().unwrap_or_else(|| "-".into()),
            b.cost_per_hour.clone().unwrap_or_else(|| "-".into()),
            b.pods.to_string(),
        ])
    });
    let widths = [
        Constraint::Length(7),
        Constraint::Min(10),
        Constraint::Length(15),
        Constraint::Length(9),
        Constraint::Length(5),
        Constraint::Length(8),
        Constraint::Length(4),
    ];
    let mut state = TableState::default().with_selected(Some(v.selected));
    f.render_stateful_widget(
        Table::new(rows, widths)
            .header(header)
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
            .highlight_symbol(">"),
        gpu_area,
        &mut state,
    );

    // The selected GPU's lines: the pods (scrolled), then the rest and the total, pinned.
    let b = &blocks[v.selected];
    let block = Block::new().borders(Borders::TOP).title(Line::from(format!(" {} ", b.title)));
    let inner = block.inner(pod_area);
    f.render_widget(block, pod_area);
    let remainder = 3 + usize::from(b.rows.len() > b.pods + 3);
    let pods: &[[String; 7]] = &b.rows[..b.rows.len() - remainder];
    let fixed_rows = &b.rows[b.rows.len() - remainder..];
    let room = (inner.height as usize).saturating_sub(1 + fixed_rows.len() + 1);
    let mut shown: Vec<Vec<String>> = Vec::new();
    if pods.len() <= room {
        v.scroll = 0;
        shown.extend(pods.iter().map(|r| r.to_vec()));
    } else {
        // The pods that do not fit become one line with their sums, so the column still adds up.
        let room = room.max(1);
        let first = (v.scroll as usize).min(pods.len() - (room - 1).min(pods.len()));
        v.scroll = first as u16;
        let last = (first + room - 1).min(pods.len());
        shown.extend(pods[first..last].iter().map(|r| r.to_vec()));
        let rest: Vec<&[String; 7]> = pods[..first].iter().chain(&pods[last..]).collect();
        let sum = |c: usize| -> String {
            let mut any = false;
            let mut total = 0u128;
            let mut decimals = 0;
            for r in &rest {
                if let Some((int, frac)) = parse_fixed(&r[c]) {
                    any = true;
                    decimals = frac.1;
                    total += int * 10u128.pow(frac.1) + frac.0;
                }
            }
            if any { fixed(total, decimals) } else { "-".into() }
        };
        shown.push(vec![
            format!("… {} more (PgUp/PgDn)", rest.len()),
            sum(1),
            sum(2),
            sum(3),
            sum(4),
            sum(5),
            String::new(),
        ]);
    }
    shown.extend(fixed_rows.iter().map(|r| r.to_vec()));
    shown.push(b.total.to_vec());
    let n = shown.len();
    let rows = shown.into_iter().enumerate().map(|(i, r)| {
        let cells: Vec<String> = if wide { r } else { r.into_iter().take(5).collect() };
        let row = Row::new(cells);
        if i + 1 == n { row.style(Style::new().add_modifier(Modifier::BOLD)) } else { row }
    });
    let mut header = vec!["POD (namespace/pod/container)", "MEM MiB", "SM %", "W", "COST/h"];
    let mut widths = vec![
        Constraint::Min(20),
        Constraint::Length(9),
        Constraint::Length(6),
        Constraint::Length(5),
        Constraint::Length(8),
    ];
    if wide {
        header.extend(["LAUNCHES", "PIDS"]);
        widths.extend([Constraint::Length(9), Constraint::Length(16)]);
    }
    f.render_widget(
        Table::new(rows, widths).header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD))),
        inner,
    );
}

/// `12.34` → (12, (34, 2)).
fn parse_fixed(s: &str) -> Option<(u128, (u128, u32))> {
    match s.split_once('.') {
        Some((i, f)) => Some((i.parse().ok()?, (f.parse().ok()?, f.len() as u32))),
        None => Some((s.parse().ok()?, (0, 0))),
    }
}

fn help(f: &mut Frame<'_>, area: Rect) {
    let text = vec![
        Line::from(Span::styled("gpu-tracer top", Style::new().add_modifier(Modifier::BOLD))),
        Line::from(""),
        Line::from("↑ ↓  k j      choose the GPU"),
        Line::from("PgUp PgDn     scroll its pods (or the details)"),
        Line::from("n  /          filter by namespace (Enter; empty: all)"),
        Line::from("s             sort: memory, SM, cost, name"),
        Line::from("p             pause (the screen stays; Ctrl-C still quits)"),
        Line::from("d  Enter      details: driver ledger per cgroup and process"),
        Line::from("q  Esc        quit"),
        Line::from(""),
        Line::from("Each column adds up to its total row as printed:"),
        Line::from("pods + driver reserved + unattributed + idle/free."),
        Line::from(""),
        Line::from("any key closes this"),
    ];
    let w = 58.min(area.width);
    let h = (text.len() as u16 + 2).min(area.height);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(text).block(Block::bordered()).alignment(Alignment::Left).wrap(Wrap { trim: false }),
        r,
    );
}

/// The terminal while `top` runs: raw mode and the alternate screen (restored on drop, also on
/// panic), keys read on a thread of their own, the latest snapshot and the view.
pub struct Screen {
    terminal: DefaultTerminal,
    keys: tokio::sync::mpsc::UnboundedReceiver<Event>,
    pub view: View,
    snap: Option<AgentSnapshot>,
    taken: Option<Instant>,
    dirty: bool,
}

impl Screen {
    /// Take over the terminal.
    pub fn start(view: View) -> io::Result<Screen> {
        let terminal = ratatui::try_init()?;
        let (tx, keys) = tokio::sync::mpsc::unbounded_channel();
        std::thread::Builder::new().name("top-keys".into()).spawn(move || {
            while let Ok(ev) = crossterm::event::read() {
                if tx.send(ev).is_err() {
                    break;
                }
            }
        })?;
        Ok(Screen { terminal, keys, view, snap: None, taken: None, dirty: true })
    }

    /// Apply the keys pressed since the last call. `false`: the user quit.
    pub fn input(&mut self) -> bool {
        while let Ok(ev) = self.keys.try_recv() {
            match ev {
                Event::Key(k) => {
                    self.dirty = true;
                    if !self.view.key(k) {
                        return false;
                    }
                }
                Event::Resize(..) => self.dirty = true,
                _ => {}
            }
        }
        true
    }

    /// Whether a new snapshot is wanted now (not paused, the interval elapsed).
    pub fn wants_snapshot(&self) -> bool {
        !self.view.paused && self.taken.is_none_or(|t| t.elapsed() >= self.view.interval)
    }

    pub fn update(&mut self, snap: AgentSnapshot) {
        self.snap = Some(snap);
        self.taken = Some(Instant::now());
        self.dirty = true;
    }

    /// Redraw if anything changed.
    pub fn draw(&mut self) -> io::Result<()> {
        if !self.dirty {
            return Ok(());
        }
        self.dirty = false;
        let (snap, view) = (self.snap.as_ref(), &mut self.view);
        self.terminal.draw(|f| draw(f, snap, view))?;
        Ok(())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

#[cfg(test)]
mod tests;
