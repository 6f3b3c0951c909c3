// The built-in chat page of `k3run --serve --web` (docs/SERVER.md "Web chat page").
// Plain JavaScript, no libraries and nothing loaded from elsewhere: the server embeds this file.
//
// Each send posts the whole conversation to /v1/chat/completions with "stream": true and renders
// the SSE deltas as they arrive (fetch's ReadableStream; EventSource cannot POST). Stop aborts
// the request (the server frees the sequence), New chat forgets the conversation. HTTP errors,
// OpenAI error bodies and error chunks are shown in the answer's place. /v1/models names the
// model; /health is polled for the badge.
//
// For tests and scripts, each answer element carries data-state (streaming, done, stopped,
// error), data-events (the SSE data lines read) and data-chunks (the content and reasoning
// deltas rendered).
'use strict';

const $ = (id) => document.getElementById(id);
const conversation = [];  // as the API takes it: {role, content[, reasoning_content]}
let chatNumber = 0;  // New chat counts up: an answer still arriving then belongs to no chat
let model = null;    // from /v1/models; requests name it once known
let controller = null;  // the AbortController of the request in flight

function headers() {
  const h = { 'Content-Type': 'application/json' };
  const key = $('api-key').value.trim();
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

function setStatus(text) { $('status').textContent = text; }

// The message of a failed response: the OpenAI error body's message, else the body's text.
async function errorText(res) {
  const text = await res.text();
  try {
    const e = JSON.parse(text).error;
    if (e && e.message) return `HTTP ${res.status}: ${e.message}`;
  } catch (_) { /* not JSON */ }
  return `HTTP ${res.status} ${res.statusText}` + (text ? `: ${text.slice(0, 300)}` : '');
}

// ---- Server state: the model's name and /health ----

async function loadModel() {
  try {
    const res = await fetch('/v1/models', { headers: headers() });
    if (!res.ok) {
      $('model').textContent = '?';
      setStatus(await errorText(res));
      return;
    }
    model = (await res.json()).data[0].id;
    $('model').textContent = model;
    setStatus('');
  } catch (e) {
    $('model').textContent = '?';
  }
}

async function pollHealth() {
  const badge = $('health');
  let next = 5000;
  try {
    const res = await fetch('/health', { cache: 'no-store' });
    const status = (await res.json()).status;
    badge.textContent = status === 'ok' ? 'ready' : status;
    badge.className = 'badge ' + (status === 'ok' ? 'ok' : 'bad');
    if (status === 'ok' && model === null) loadModel();
    if (status === 'loading') next = 1000;
  } catch (e) {
    badge.textContent = 'offline';
    badge.className = 'badge bad';
  }
  setTimeout(pollHealth, next);
}

// ---- The conversation on screen ----

function addMessage(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  if (role === 'assistant') {
    div.innerHTML = '<div class="thinking"></div><div class="content"></div><div class="meta"></div>';
    div.dataset.state = 'streaming';
    div.dataset.chunks = '0';
    div.dataset.events = '0';
  } else {
    div.textContent = text;
  }
  follow(() => $('log').appendChild(div));
  return div;
}

// Runs `change`; keeps the page scrolled to the end if it was there (a reader who scrolled up
// stays where they are).
function follow(change) {
  const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
  change();
  if (atEnd) window.scrollTo(0, document.body.scrollHeight);
}

function showError(div, text) {
  const p = document.createElement('div');
  p.className = 'error';
  p.textContent = text;
  div.appendChild(p);
}

function setBusy(busy) {
  $('send').disabled = busy;
  $('stop').disabled = !busy;
}

// ---- Streaming: SSE events over the response body ----

// Calls onEvent(data) for each event's data (its data: lines joined), as events complete.
async function readSse(res, onEvent) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { done, value } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = done ? '' : events.pop();
    for (const event of events) {
      const data = event.split(/\r?\n/)
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(line.startsWith('data: ') ? 6 : 5))
        .join('\n');
      if (data) onEvent(data);  // comments (": keep-alive") have no data
    }
    if (done) return;
  }
}

function requestBody() {
  const messages = [];
  const system = $('system').value.trim();
  if (system) messages.push({ role: 'system', content: system });
  messages.push(...conversation);
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if (model) body.model = model;
  const maxTokens = parseInt($('max-tokens').value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  const temperature = parseFloat($('temperature').value);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  if ($('effort').value) body.reasoning_effort = $('effort').value;
  return body;
}

async function send(text) {
  const chat = chatNumber;
  conversation.push({ role: 'user', content: text });
  const question = addMessage('user', text);
  const div = addMessage('assistant');
  const thinking = div.querySelector('.thinking');
  const content = div.querySelector('.content');
  const answer = { content: '', reasoning: '', finish: null, usage: null, error: null };
  const started = performance.now();
  controller = new AbortController();
  setBusy(true);
  try {
    const res = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(), body: JSON.stringify(requestBody()),
      signal: controller.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    await readSse(res, (data) => {
      div.dataset.events = String(Number(div.dataset.events) + 1);
      if (data === '[DONE]') return;
      const chunk = JSON.parse(data);
      if (chunk.error) { answer.error = chunk.error.message || JSON.stringify(chunk.error); return; }
      if (chunk.usage) answer.usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) return;
      const delta = choice.delta || {};
      if (delta.content || delta.reasoning_content) {
        answer.reasoning += delta.reasoning_content || '';
        answer.content += delta.content || '';
        follow(() => {
          thinking.textContent = answer.reasoning;
          content.textContent = answer.content;
        });
        div.dataset.chunks = String(Number(div.dataset.chunks) + 1);
      }
      if (choice.finish_reason) answer.finish = choice.finish_reason;
    });
    if (answer.error) throw new Error(answer.error);
    div.dataset.state = 'done';
  } catch (e) {
    if (e.name === 'AbortError') {
      div.dataset.state = 'stopped';
      answer.finish = 'stopped';
    } else {
      div.dataset.state = 'error';
      showError(div, e.message);
    }
  } finally {
    controller = null;
    setBusy(false);
  }
  if (chat !== chatNumber) return;  // New chat was pressed meanwhile
  // The answer joins the conversation if any of it arrived; a failed exchange leaves it (and
  // its question goes back to the input box, to send again).
  if (answer.content || answer.reasoning) {
    const m = { role: 'assistant', content: answer.content };
    if (answer.reasoning) m.reasoning_content = answer.reasoning;
    conversation.push(m);
  } else if (div.dataset.state === 'error') {
    conversation.pop();
    question.classList.add('failed');
    if (!$('input').value) $('input').value = text;
    return;
  }
  const seconds = (performance.now() - started) / 1000;
  const parts = [answer.finish || div.dataset.state];
  if (answer.usage) {
    const n = answer.usage.completion_tokens;
    parts.push(`${answer.usage.prompt_tokens} tokens in, ${n} out`,
      `${seconds.toFixed(1)} s`, `${(n / seconds).toFixed(1)} tok/s`);
  }
  div.querySelector('.meta').textContent = parts.join(' · ');
}

// ---- Controls ----

$('composer').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('input').value;
  if (controller || !text.trim()) return;
  $('input').value = '';
  send(text);
});
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $('composer').requestSubmit();
  }
});
$('stop').addEventListener('click', () => { if (controller) controller.abort(); });
$('clear').addEventListener('click', () => {
  if (controller) controller.abort();
  conversation.length = 0;
  chatNumber += 1;
  $('log').replaceChildren();
  setStatus('');
  $('input').focus();
});
$('api-key').addEventListener('change', loadModel);

pollHealth();  // and, once the server is ready, loadModel
$('input').focus();
