// The game page: one turn at a time through /api/turn (an NDJSON stream of the turn's events).
// window.agj keeps timings (performance.now() ms) that the browser test reads.
"use strict";
const $ = (s) => document.querySelector(s);
const METERS = ["social", "entertainment", "stamina"];
const FIELDS = ["character", "motion", "background", "line"];
const agj = (window.agj = { tClick: null, tFirstFrame: null, tDone: null, framesShown: 0, turnsDone: 0, events: [] });
let current = null; // the last state from the server
let busy = false;

function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// the same markup as game/folder/gallery.py meters_html
function metersHtml(meters, deltas) {
  return '<div class="meters">' + METERS.map((n) => {
    const v = meters[n];
    const d = deltas ? deltas[n] : null;
    const cls = d === null ? "" : d > 0 ? "up" : d < 0 ? "down" : "";
    const ds = d === null ? "" : (d >= 0 ? "+" : "") + d; // as Python's {:+d}
    return `<span class="name">${n}</span><span class="bar" role="meter" aria-valuemin="0" aria-valuemax="100" ` +
      `aria-valuenow="${v}" aria-label="${n}"><span class="fill ${n}" style="width:${Math.max(0, Math.min(100, v))}%">` +
      `</span></span><span class="value" data-meter="${n}">${v}</span><span class="delta ${cls}" data-delta="${n}">${ds}</span>`;
  }).join("") + "</div>";
}

function statesText(s) {
  const f = (v) => (v > 0 ? "+" : "") + v;
  return `motion level ${s.ML} · SC ${f(s.SC)} · ET ${f(s.ET)} · ST ${f(s.ST)}`;
}

function setStatus(text) { $("#status").textContent = text; }

function showError(message, fields) {
  const el = $("#error");
  el.textContent = message;
  el.hidden = !message;
  for (const f of FIELDS) $("#" + f).setAttribute("aria-invalid", fields && fields.includes(f) ? "true" : "false");
}

function setBusy(b) {
  busy = b;
  $("#generate").disabled = b;
  $("#restart").disabled = b;
  $("#char-upload").disabled = b || (current !== null && current.references === false);
  $("#branch").disabled = b || !current || current.turns.length === 0;
  $("#undo").disabled = b || !current || current.turns.length === 0;
}

function hideLive() { $("#live").hidden = true; liveReset(); }

function playClip(src) {
  const v = $("#clip");
  if (!src) { v.removeAttribute("src"); v.load(); $("#placeholder").hidden = false; return; }
  $("#placeholder").hidden = true;
  if (v.getAttribute("src") !== src) { v.src = src; }
  v.muted = true;
  // the streamed frames give way to the finished clip once it plays (or, if autoplay is
  // refused, once it can be shown with its controls)
  v.addEventListener("loadeddata", hideLive, { once: true });
  v.play().then(hideLive, () => {});
}

let shownTurn = -1; // the turn in the player (Branch from here keeps the turns up to it)

function render(state, { play = true } = {}) {
  current = state;
  const n = state.turns.length;
  shownTurn = n - 1;
  $("#saved-games").innerHTML = (state.saved_games || []).map((g) =>
    `<li>${g.current ? `<b>${esc(g.game_id)}</b> (playing)` :
      `<a href="#" data-game="${esc(g.game_id)}" title="continue this game">${esc(g.game_id)}</a>`} · ` +
    `${g.turns} turn${g.turns === 1 ? "" : "s"}</li>`).join("");
  for (const a of $("#saved-games").querySelectorAll("a[data-game]")) {
    a.addEventListener("click", async (e) => {
      e.preventDefault();
      const j = await simple("/api/continue", { game_id: a.dataset.game });
      if (j) setStatus(`Continuing ${j.game_id} (${j.turns.length} turns).`);
    });
  }
  const chars = state.characters || [];
  $("#characters").textContent = state.references === false ? "This server's system has no reference adapter." :
    chars.length ? `This game's characters from pictures: ${chars.join(", ")}.` : "";
  $("#char-upload").disabled = busy || state.references === false;
  $("#info").textContent = `game ${state.game_id} · seed ${state.seed} · ${n} turn${n === 1 ? "" : "s"} · ` +
    `${state.config} (${state.mode}) · ${state.system}`;
  $("#about").textContent = state.system_description || "";
  if ($("#seed").value === "") $("#seed").value = state.seed;
  const last = n ? state.turns[n - 1] : null;
  $("#meters").innerHTML = metersHtml(state.meters, last ? last.deltas : null);
  $("#motion-level").textContent = last ? statesText(last.states) : "no turn yet";
  $("#links").innerHTML = state.download
    ? `<a id="download" href="${esc(state.download)}" download>download the game folder (.zip)</a> · ` +
      `<a id="gallery" href="${esc(state.gallery)}" target="_blank" rel="noopener">gallery</a>` +
      `<br><span class="muted">saved in ${esc(state.folder)}</span>`
    : "";
  const hist = $("#history");
  hist.innerHTML = state.turns.map((t) =>
    `<figure class="turn${t.turn === n - 1 ? " current" : ""}" data-turn="${t.turn}" tabindex="0">` +
    `<video src="${esc(t.video)}" muted playsinline preload="metadata" class="pixelated"></video>` +
    `<figcaption><b>Turn ${t.turn + 1}</b>: ${esc(t.instruction)}<div class="states">${esc(statesText(t.states))}</div>` +
    metersHtml(t.meters, t.deltas) + "</figcaption></figure>").join("");
  for (const fig of hist.querySelectorAll("figure")) {
    const t = state.turns[Number(fig.dataset.turn)];
    const show = () => {
      hist.querySelectorAll("figure").forEach((f) => f.classList.toggle("current", f === fig));
      shownTurn = t.turn;
      branchLabel();
      $("#caption").textContent = `Turn ${t.turn + 1}: ${t.instruction}`;
      playClip(t.video);
    };
    fig.addEventListener("click", show);
    fig.addEventListener("keydown", (e) => { if (e.key === "Enter") show(); });
  }
  hist.scrollLeft = hist.scrollWidth; // the newest turn in view, without scrolling the page
  $("#caption").textContent = last ? `Turn ${last.turn + 1}: ${last.instruction}` : "";
  if (play) playClip(last ? last.video : null);
  branchLabel();
  setBusy(state.busy);
}

// "Branch from turn k": the turn in the player (the last one, or the one picked in the history)
function branchLabel() {
  $("#branch").textContent = shownTurn >= 0 ? `Branch from turn ${shownTurn + 1}` : "Branch from here";
}

// frames of the turn being decoded, shown at the game's fps as they arrive
const live = { frames: [], shown: 0, timer: null };
function liveReset() {
  live.frames = []; live.shown = 0;
  if (live.timer) clearInterval(live.timer);
  live.timer = null;
}
function liveAdd(urls, fps, start) {
  // frames from `start` on replace those already there (game.decoder=preview_then_full: the preview
  // decoder's clip first, then the VAE's chunks from frame 0)
  if (start !== undefined && start < live.frames.length) {
    live.frames.length = start;
    live.shown = Math.min(live.shown, start);
  }
  live.frames.push(...urls);
  const img = $("#live");
  const next = () => {
    if (live.shown >= live.frames.length) return;
    img.src = live.frames[live.shown++];
    img.decode().then(() => {
      agj.framesShown += 1;
      if (agj.tFirstFrame === null) agj.tFirstFrame = performance.now();
    }).catch(() => {});
  };
  if (live.timer === null) {
    img.hidden = false;
    $("#placeholder").hidden = true;
    next();
    live.timer = setInterval(next, 1000 / (fps || 8));
  }
}

function onEvent(ev) {
  agj.events.push(ev.event);
  switch (ev.event) {
    case "queued":
      setStatus(ev.ahead > 0 ? `Waiting in the queue: position ${ev.position} (${ev.ahead} turn${ev.ahead === 1 ? "" : "s"} ahead)`
                             : "Queued: starting…");
      break;
    case "started":
      setStatus("Generating: predicting the states and sampling the clip…");
      break;
    case "frames":
      setStatus(`Decoding: ${ev.start + ev.frames.length} frames so far…`);
      liveAdd(ev.frames, current ? current.fps : 8, ev.start);
      break;
    case "done": {
      agj.tDone = performance.now();
      agj.turnsDone += 1;
      const t = ev.state.turns[ev.state.turns.length - 1];
      setStatus(`Turn ${t.turn + 1} done in ${((agj.tDone - agj.tClick) / 1000).toFixed(1)} s ` +
        `(first frames after ${agj.tFirstFrame ? ((agj.tFirstFrame - agj.tClick) / 1000).toFixed(1) : "?"} s).`);
      render(ev.state);
      break;
    }
    case "error":
      showError(ev.message, []);
      setStatus("The turn failed; the game is as it was.");
      hideLive();
      break;
  }
}

async function readStream(resp) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (line.trim()) onEvent(JSON.parse(line));
    }
  }
}

async function postJson(path, body) {
  return fetch(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}) });
}

async function generate(e) {
  e.preventDefault();
  if (busy) return;
  showError("", []);
  const body = {};
  for (const f of FIELDS) body[f] = $("#" + f).value;
  agj.tClick = performance.now(); agj.tFirstFrame = null; agj.tDone = null;
  liveReset();
  $("#clip").pause(); // the last clip holds still under the new turn's frames
  setBusy(true);
  setStatus("Sending…");
  try {
    const resp = await postJson("/api/turn", body);
    if (!resp.ok) {
      const j = await resp.json();
      showError(j.error, j.fields || []);
      setStatus("");
      setBusy(false);
      return;
    }
    await readStream(resp);
  } catch (err) {
    showError(`Lost the connection to the server (${err}). Reload the page: the game is saved after every turn.`, []);
  }
  await refresh({ play: false });
}

async function simple(path, body) {
  if (busy) return;
  showError("", []);
  const resp = await postJson(path, body);
  const j = await resp.json();
  if (!resp.ok) { showError(j.error, []); return; }
  hideLive();
  render(j);
  return j;
}

async function refresh(opts) {
  const resp = await fetch("/api/state");
  if (resp.ok) render(await resp.json(), opts);
}

$("#turn-form").addEventListener("submit", generate);
$("#undo").addEventListener("click", async () => {
  const j = await simple("/api/undo");
  if (j) setStatus(`Undone: ${j.turns.length} turn${j.turns.length === 1 ? "" : "s"} left.`);
});
$("#restart").addEventListener("click", async () => {
  const seed = $("#seed").value === "" ? undefined : Number($("#seed").value);
  const j = await simple("/api/restart", seed === undefined ? {} : { seed });
  if (j) setStatus("New game started; the previous one stays saved.");
});
$("#branch").addEventListener("click", async () => {
  const j = await simple("/api/branch", { turns: shownTurn + 1 });
  if (j) setStatus(`Branched: a new game ${j.game_id} from turn ${j.turns.length}; the other one stays saved.`);
});
const MAX_CHARACTER_BYTES = 8 * 1024 * 1024; // the server's limit (web/sessions.py MAX_CHARACTER_BYTES)
function fileBase64(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result).replace(/^data:[^,]*,/, ""));
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}
$("#character-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  if (busy) return;
  const name = $("#char-name").value.trim();
  const file = $("#char-image").files[0];
  if (!name || !file) { showError("Give the character's name and pick a picture of it.", []); return; }
  if (file.size > MAX_CHARACTER_BYTES) { showError(`${file.name} is over 8 MB. Pick a smaller picture.`, []); return; }
  setStatus(`Uploading ${file.name}…`);
  const j = await simple("/api/character", { name, image_b64: await fileBase64(file) });
  setStatus(j ? `New game ${j.game_id}: turns naming ${name} use ${file.name}; the previous game stays saved.` : "");
  if (j) $("#character").value = name;
});
refresh();
