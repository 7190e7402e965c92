"use strict";
(function () {
  const INDEX = JSON.parse(document.getElementById("rw-index").textContent);
  const VOCAB = JSON.parse(document.getElementById("rw-vocab").textContent);
  const PAGE = 25;
  const cache = new Map();
  const flat = [];
  for (const g of INDEX.groups) for (const r of g.rollouts) flat.push({ g: g, r: r });
  let page = 0;

  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, (c) => (
    { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const num = (x, d) => (x == null || Number.isNaN(x) ? "n/a" : Number(x).toFixed(d == null ? 3 : d));
  const pct = (x) => (x == null ? "n/a" : (100 * x).toFixed(1) + " %");

  function card(k, v, d) {
    return `<div class="card"><div class="k">${esc(k)}</div><div class="v">${esc(v)}</div>` +
      (d ? `<div class="d">${esc(d)}</div>` : "") + "</div>";
  }

  function renderCards() {
    const s = INDEX.summary;
    const st = Object.entries(s.statuses).map(([k, v]) => `${k} ${v}`).join(", ");
    const forks = Object.entries(s.forks).map(([k, v]) => `${k} ${v}`).join(", ") || "none";
    const lost = Object.values(s.fork_tokens_lost).reduce((a, b) => a + b, 0);
    $("cards").innerHTML = [
      card("rollouts", s.rollouts, st),
      card("groups", s.groups),
      card("reward mean ± std", `${num(s.reward_mean)} ± ${num(s.reward_std)}`),
      card("calls per rollout", num(s.turns_mean, 2), `${s.calls} calls`),
      card("rows per rollout", num(s.rows_mean, 2), `${s.rows} rows`),
      card("trainable tokens", pct(s.trainable_share), `${s.trainable_tokens} of ${s.response_tokens} response tokens`),
      card("forks", Object.values(s.forks).reduce((a, b) => a + b, 0), `${forks}; ${lost} trainable tokens lost`),
      card("failed calls", s.failed_calls),
      card("non-trainable calls", s.non_trainable_calls),
      card("off-policy calls", s.off_policy_calls, Object.entries(s.flags).map(([k, v]) => `${k} ${v}`).join(", ")),
      card("stale calls", s.stale_calls, "sampled beyond max_staleness versions behind the trainer; not trained"),
      card("routed experts", pct(s.experts_coverage), `${s.calls_with_experts} calls, ${s.rows_with_experts} rows`),
      toolCard(s.tools),
      card("policy versions", Object.keys(s.policy_versions).length || "n/a",
        Object.entries(s.policy_versions).map(([k, v]) => `${k}: ${v}`).join(", ")),
    ].join("");
  }

  function toolCard(t) {
    const offered = t && t.offered;
    const flag = offered && t.none_parsed ? "⚠ tools offered, none parsed: is the server's tool parser the model's format? " : "";
    const d = offered ? `${flag}${t.offered} calls offered tools; ${t.unparsed} answers hold tool-call text that did not parse` : "no call offered tools";
    const warn = offered && (t.none_parsed || t.unparsed) ? " warn" : "";
    return `<div class="card${warn}" id="tool-health"><div class="k">tool calls parsed</div>` +
      `<div class="v">${offered ? esc(t.parsed) : "n/a"}</div><div class="d">${esc(d)}</div></div>`;
  }

  function renderDrift() {
    if (!INDEX.drift.length) {
      $("drift-body").innerHTML = '<p class="muted">No forks: every call extended its row.</p>';
      return;
    }
    const rows = INDEX.drift.map((d) => `<tr><td><span class="badge warn">${esc(d.kind)}</span></td>` +
      `<td>${d.count}</td><td>${d.tokens_lost}</td><td>${d.rollouts}</td><td>${esc(d.advice)}</td></tr>`);
    $("drift-body").innerHTML = '<table id="drift-table"><thead><tr><th>class</th><th>forks</th>' +
      "<th>trainable tokens lost</th><th>rollouts</th><th>what to do</th></tr></thead><tbody>" +
      rows.join("") + "</tbody></table>";
  }

  function matches(item, text, kind) {
    const r = item.r;
    if (text && !(r.id.includes(text) || String(item.g.id).includes(text))) return false;
    if (kind === "failed") return r.st !== "completed" || r.failed_calls > 0;
    if (kind === "forked") return r.forks.length > 0;
    if (kind === "off") return r.off > 0;
    if (kind === "experts") return r.ex;
    return true;
  }

  function chip(r) {
    const adv = r.adv == null ? "" : ` → <span class="adv ${r.adv > 0 ? "pos" : r.adv < 0 ? "neg" : ""}">${num(r.adv, 2)}</span>`;
    const forks = r.forks.length ? ` <span class="badge warn">${r.forks.length} fork</span>` : "";
    const bad = r.st !== "completed" ? ` <span class="badge bad">${esc(r.st)}</span>` : "";
    return `<button class="chip ${esc(r.st)}" data-n="${r.n}" title="${esc(r.id)}: ${r.calls} calls, ${r.rows} rows">` +
      `${esc(r.id)}: ${num(r.rw, 2)}${adv}${forks}${bad}</button>`;
  }

  function renderGroups() {
    const text = $("filter-text").value.trim();
    const kind = $("filter-kind").value;
    const groups = [];
    for (const g of INDEX.groups) {
      const rs = g.rollouts.filter((r) => matches({ g: g, r: r }, text, kind));
      if (rs.length) groups.push([g, rs]);
    }
    const pages = Math.max(1, Math.ceil(groups.length / PAGE));
    page = Math.min(page, pages - 1);
    const shown = groups.slice(page * PAGE, (page + 1) * PAGE);
    $("group-table").tBodies[0].innerHTML = shown.map(([g, rs]) =>
      `<tr><td class="mono">${esc(g.id)}</td><td class="mono">${esc(g.task)}</td>` +
      `<td>${num(g.mean, 2)} ± ${num(g.std, 2)}</td><td>${rs.map(chip).join("")}</td></tr>`).join("");
    $("pager").innerHTML = `<span class="pager">${groups.length} groups · page ${page + 1} / ${pages} ` +
      `<button id="prev" ${page === 0 ? "disabled" : ""}>‹</button><button id="next" ${page >= pages - 1 ? "disabled" : ""}>›</button></span>`;
    $("prev").onclick = () => { page -= 1; renderGroups(); };
    $("next").onclick = () => { page += 1; renderGroups(); };
  }

  async function chunk(i) {
    if (cache.has(i)) return cache.get(i);
    const b64 = $("rw-chunk-" + i).textContent.trim();
    const bin = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const stream = new Blob([bin]).stream().pipeThrough(new DecompressionStream("gzip"));
    const data = JSON.parse(await new Response(stream).text());
    cache.set(i, data);
    return data;
  }

  function piece(id) {
    if (!INDEX.tokenizer) return id + " ";
    const p = VOCAB[id];
    return p == null ? `<${id}>` : p;
  }

  function tokenView(row) {
    const out = [];
    const n = row.ids.length;
    let lastTurn = -2;
    for (let i = 0; i < n; i++) {
      const role = row.roles[i];
      const j = i - row.pl;
      if (j === 0) out.push('<span class="boundary">response</span>');
      let cls = "tok " + role + (j < 0 ? " prompt" : "");
      let tip = `#${i} id ${row.ids[i]} · ${INDEX.roles[role]}`;
      let style = "";
      if (j >= 0) {
        const turn = row.turn[j];
        if (turn >= 0 && turn !== lastTurn) out.push(`<span class="boundary">call ${turn}</span>`);
        lastTurn = turn;
        if (role === "P" || role === "S") {
          const lp = row.lp[j];
          tip += ` · logprob ${lp.toFixed(3)} · call ${turn}`;
          style = ` style="--a:${(0.15 + 0.75 * Math.exp(lp)).toFixed(2)}"`;
        }
      }
      out.push(`<span class="${cls}"${style} data-lp="${j >= 0 ? row.lp[j] : ""}" title="${esc(tip)}">${esc(piece(row.ids[i]))}</span>`);
    }
    return out.join("");
  }

  function forkView(row, k) {
    const f = row.fork;
    if (!f) return "";
    return `<div class="fork" data-kind="${esc(f.kind)}"><strong>fork before row ${k}</strong>` +
      `<span class="badge warn">${esc(f.kind)}</span> first differing position <b>${f.pos}</b> · ` +
      `${f.lost} trainable tokens lost · started by call <code>${esc(f.call)}</code>` +
      (f.from != null ? ` · differs from row ${f.from}` : "") +
      `<div class="diff"><pre class="old"><span class="ctx">${esc(f.ctx)}</span><mark>${esc(f.old)}</mark></pre>` +
      `<pre class="new"><span class="ctx">${esc(f.ctx)}</span><mark>${esc(f.new)}</mark></pre></div>` +
      `<div class="muted">left: what the earlier row holds · right: the prompt of the new row</div></div>`;
  }

  function callsTable(calls) {
    const rows = calls.map((c) => {
      const flags = [c.off ? '<span class="badge warn">off-policy</span>' : "",
        c.tr ? "" : '<span class="badge warn">not trained</span>',
        c.st !== "ok" ? `<span class="badge bad">${esc(c.st)}</span>` : "",
        c.ex ? '<span class="badge">experts</span>' : "",
        c.unparsed ? '<span class="badge bad">tool call not parsed</span>' : "",
        ...c.flags.map((f) => `<span class="badge">${esc(f)}</span>`)].join("");
      const tools = c.tools.map((t) => `<code>${esc(t.name)}(${esc(t.arguments)})</code>`).join("");
      return `<tr><td>${c.i}</td><td>${esc(c.fin)}</td><td>${c.ms} ms</td><td>${c.np} / ${c.nc}</td>` +
        `<td>${flags}${c.err ? `<div class="err">${esc(c.err)}</div>` : ""}</td><td class="tools">${tools}</td>` +
        `<td class="mono">${esc(c.pv)}</td><td class="mono">${esc(JSON.stringify(c.samp))}</td></tr>`;
    });
    return '<table class="calls"><thead><tr><th>call</th><th>finish</th><th>latency</th><th>prompt / completion</th>' +
      "<th>flags</th><th>tool calls (parsed)</th><th>policy</th><th>sampling</th></tr></thead><tbody>" +
      rows.join("") + "</tbody></table>";
  }

  function legend() {
    return '<div class="legend">' + Object.entries(INDEX.roles).map(([k, v]) =>
      `<span><i class="tok ${k}" style="--a:.7"></i>${esc(v)}</span>`).join("") +
      '<span class="muted">policy tokens: darker = more likely (hover for the log-prob)</span></div>';
  }

  async function openRollout(n) {
    const item = flat[n];
    if (!item) return;
    const data = (await chunk(Math.floor(n / INDEX.chunk)))[n % INDEX.chunk];
    const r = item.r;
    $("rollout").hidden = false;
    $("rollout-title").textContent = `Rollout ${r.id}`;
    const head = `<p>group <code>${esc(item.g.id)}</code> · status <span class="badge ${r.st === "completed" ? "" : "bad"}">${esc(r.st)}</span>` +
      ` · reward <b>${num(r.rw, 3)}</b> · advantage <b>${num(r.adv, 3)}</b> · ${r.calls} calls → ${r.rows} rows · ${r.trained} trained tokens</p>` +
      (data.err ? `<div class="err">${esc(data.err)}</div>` : "") +
      (Object.keys(data.metrics).length ? `<p class="mono">metrics ${esc(JSON.stringify(data.metrics))}</p>` : "");
    const rows = data.rows.map((row, k) => forkView(row, k) +
      `<h3>row ${k} <span class="muted">prompt ${row.pl} · response ${row.ids.length - row.pl} · trained ${row.trained}` +
      `${row.ex ? " · routed experts" : ""}</span></h3><div class="tokens" data-row="${k}">${tokenView(row)}</div>`);
    $("rollout-body").innerHTML = head + "<h3>calls</h3>" + callsTable(data.calls) + legend() +
      (rows.length ? rows.join("") : '<p class="muted">No usable call: this rollout trains nothing.</p>');
    $("rollout").scrollIntoView();
    document.body.dataset.rollout = String(n);
  }

  function route() {
    const m = /^#rollout=(\d+)$/.exec(location.hash) || /^#id=(.+)$/.exec(location.hash);
    if (!m) return;
    const n = /^\d+$/.test(m[1]) && location.hash.startsWith("#rollout=") ? Number(m[1])
      : flat.findIndex((x) => x.r.id === decodeURIComponent(m[1]));
    if (n >= 0) openRollout(n);
  }

  renderCards();
  renderDrift();
  renderGroups();
  $("filter-text").oninput = () => { page = 0; renderGroups(); };
  $("filter-kind").onchange = () => { page = 0; renderGroups(); };
  $("group-table").addEventListener("click", (e) => {
    const b = e.target.closest("[data-n]");
    if (b) location.hash = "rollout=" + b.dataset.n;
  });
  window.addEventListener("hashchange", route);
  route();
  document.body.dataset.ready = "1";
})();
