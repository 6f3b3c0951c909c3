// A real OpenAI client against `k3run --serve` (run by tests/k3run/server_node_test.cpp):
// node chat_stream.mjs BASE_URL MODEL [API_KEY]
// Streams a chat completion with the official openai package and prints one JSON line:
// {"content", "reasoning", "finish_reason", "chunks", "model"}; also lists the models and makes
// one non-streamed call. Exits non-zero on any error.
import OpenAI from 'openai';

const [baseURL, model, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: apiKey ?? 'none', maxRetries: 0, timeout: 120000 });

const models = await client.models.list();
const ids = models.data.map((m) => m.id);
if (!ids.includes(model)) throw new Error(`model ${model} not in ${JSON.stringify(ids)}`);

const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Say hello.' },
];
const stream = await client.chat.completions.create({
  model, messages, stream: true, max_tokens: 12, temperature: 0, reasoning_effort: 'low',
  stream_options: { include_usage: true },
});
let content = '';
let reasoning = '';
let finish = null;
let chunks = 0;
let usage = null;
for await (const chunk of stream) {
  chunks += 1;
  if (chunk.usage) usage = chunk.usage;
  const choice = chunk.choices[0];
  if (!choice) continue;
  content += choice.delta?.content ?? '';
  reasoning += choice.delta?.reasoning_content ?? '';
  if (choice.finish_reason) finish = choice.finish_reason;
}
const whole = await client.chat.completions.create({
  model, messages, max_tokens: 12, temperature: 0, reasoning_effort: 'low',
});
console.log(JSON.stringify({
  content, reasoning, finish_reason: finish, chunks, usage,
  whole_content: whole.choices[0].message.content,
  whole_reasoning: whole.choices[0].message.reasoning_content,
}));
