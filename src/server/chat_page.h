// The chat page served at "/": one self-contained HTML file (no external scripts, styles or
// fonts) that talks to /v1/chat/completions with streaming, keeps the conversation in the page
// and sends it whole each turn (the server reuses the prefix it has already seen), and shows
// each answer's speed, the share of the prompt the server reused, and the expert cache hit rate.
#pragma once

#include <string_view>

namespace swiftlet::server {

inline std::string_view chat_page_html() {
  return R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>swiftlet chat</title>
<style>
  :root { --bg:#f6f7f9; --fg:#1d2330; --muted:#6b7385; --user:#dfe9ff; --bot:#fff; --line:#d9dde5; --accent:#2456d6; }
  * { box-sizing: border-box; }
  body { margin:0; font:15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; background:var(--bg); color:var(--fg);
         display:flex; flex-direction:column; height:100vh; }
  header { display:flex; align-items:center; gap:12px; padding:8px 16px; border-bottom:1px solid var(--line); background:#fff; flex-wrap:wrap; }
  header h1 { font-size:16px; margin:0; }
  header .model { color:var(--muted); font-size:13px; }
  header label { font-size:12px; color:var(--muted); display:flex; align-items:center; gap:4px; }
  header input[type=number] { width:64px; } header input[type=password] { width:120px; }
  #log { flex:1; overflow-y:auto; padding:16px; display:flex; flex-direction:column; gap:10px; }
  .msg { max-width:820px; padding:10px 14px; border-radius:10px; white-space:pre-wrap; word-wrap:break-word; border:1px solid var(--line); }
  .msg.user { align-self:flex-end; background:var(--user); }
  .msg.assistant { align-self:flex-start; background:var(--bot); }
  .msg.error { align-self:stretch; background:#ffe9e9; border-color:#f3b5b5; }
  .msg details { color:var(--muted); font-size:13px; margin-bottom:6px; }
  .meta { font-size:12px; color:var(--muted); margin-top:6px; white-space:normal; }
  form { display:flex; gap:8px; padding:12px 16px; border-top:1px solid var(--line); background:#fff; }
  textarea { flex:1; resize:none; height:64px; font:inherit; padding:8px; border:1px solid var(--line); border-radius:8px; }
  button { font:inherit; padding:0 18px; border-radius:8px; border:1px solid var(--accent); background:var(--accent); color:#fff; cursor:pointer; }
  button.secondary { background:#fff; color:var(--accent); }
  button:disabled { opacity:.5; cursor:default; }
  #stats { font-size:12px; color:var(--muted); margin-left:auto; }
</style>
</head>
<body>
<header>
  <h1>swiftlet</h1><span class="model" id="model">connecting…</span>
  <label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.7"></label>
  <label>max tokens <input id="max_tokens" type="number" min="1" step="1" value="512"></label>
  <label><input id="thinking" type="checkbox"> thinking</label>
  <label>API key <input id="api_key" type="password" autocomplete="off"></label>
  <button type="button" class="secondary" id="reset">New chat</button>
  <span id="stats"></span>
</header>
<div id="log" aria-live="polite"></div>
<form id="form">
  <textarea id="input" placeholder="Message (Enter to send, Shift+Enter for a new line)"></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" class="secondary" disabled>Stop</button>
</form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const log = $("log");
let history = [];        // the conversation, sent whole each turn
let controller = null;   // aborts the answer being streamed
let modelId = "";

const keyField = $("api_key");
keyField.value = localStorage.getItem("swiftlet_api_key") || "";
keyField.addEventListener("change", () => localStorage.setItem("swiftlet_api_key", keyField.value));

function headers() {
  const h = { "Content-Type": "application/json" };
  if (keyField.value) h["Authorization"] = "Bearer " + keyField.value;
  return h;
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const body = document.createElement("div");
  body.className = "content";
  body.textContent = text || "";
  div.appendChild(body);
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return div;
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : r.statusText);
    modelId = j.data[0].id;
    const meta = j.data[0].meta;
    $("model").textContent = modelId + (meta ? " · " + meta.family + " · ctx " + meta.context_length : "");
  } catch (e) {
    $("model").textContent = "model list unavailable: " + e.message;
  }
}

function pct(x) { return (100 * x).toFixed(0) + "%"; }

function showStats(div, usage, timings) {
  const parts = [];
  if (timings) parts.push(timings.decode_tokens_per_second.toFixed(1) + " tok/s");
  if (usage) {
    parts.push(usage.completion_tokens + " tokens");
    const hit = usage.prompt_tokens ? usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens : 0;
    parts.push("prompt " + usage.prompt_tokens + " (reused " + usage.prompt_tokens_details.cached_tokens + ", cache hit " + pct(hit) + ")");
  }
  if (timings && timings.expert_bytes_read !== undefined)
    parts.push("expert cache hit " + pct(timings.expert_cache_hit_rate));
  const meta = document.createElement("div");
  meta.className = "meta";
  meta.textContent = parts.join(" · ");
  div.appendChild(meta);
  $("stats").textContent = parts.slice(0, 1).concat(parts.slice(2)).join(" · ");
}

async function send(text) {
  history.push({ role: "user", content: text });
  bubble("user", text);
  const div = bubble("assistant", "");
  const body = div.querySelector(".content");
  let reasoningEl = null, content = "", reasoning = "", usage = null, timings = null, finish = null;
  controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  try {
    const req = {
      model: modelId || undefined, messages: history, stream: true, stream_options: { include_usage: true },
      temperature: Number($("temperature").value), max_tokens: Number($("max_tokens").value),
      chat_template_kwargs: { enable_thinking: $("thinking").checked },
    };
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(req), signal: controller.signal });
    if (!r.ok) {
      let msg = r.status + " " + r.statusText;
      try { const j = await r.json(); if (j.error) msg = j.error.message; } catch (_) {}
      throw new Error(msg);
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          if (j.usage) usage = j.usage;
          if (j.timings) timings = j.timings;
          for (const c of j.choices || []) {
            if (c.delta && c.delta.reasoning_content) {
              if (!reasoningEl) {
                const d = document.createElement("details");
                d.innerHTML = "<summary>thinking</summary>";
                reasoningEl = document.createElement("div");
                d.appendChild(reasoningEl);
                div.insertBefore(d, body);
              }
              reasoning += c.delta.reasoning_content;
              reasoningEl.textContent = reasoning;
            }
            if (c.delta && c.delta.content) { content += c.delta.content; body.textContent = content; }
            if (c.finish_reason) finish = c.finish_reason;
          }
          log.scrollTop = log.scrollHeight;
        }
      }
    }
    history.push({ role: "assistant", content: content });
    showStats(div, usage, timings);
    if (finish === "length") div.querySelector(".meta").textContent += " · stopped at max tokens";
    div.dataset.done = "1";
  } catch (e) {
    if (e.name === "AbortError") {
      history.push({ role: "assistant", content: content });
      div.dataset.done = "1";
    } else {
      history.pop();
      div.remove();
      bubble("error", "Error: " + e.message);
    }
  } finally {
    controller = null;
    $("send").disabled = false; $("stop").disabled = true;
  }
}

$("form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("reset").addEventListener("click", () => { if (controller) controller.abort(); history = []; log.innerHTML = ""; $("stats").textContent = ""; });
loadModel();
</script>
</body>
</html>
)HTML";
}

}  // namespace swiftlet::server
