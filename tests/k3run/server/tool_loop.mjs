// A full tool-call loop of the official openai client against `k3run --serve` (run by
// tests/k3run/server_node_test.cpp): node tool_loop.mjs BASE_URL MODEL
// 1. runTools with streaming and a forced function: the SDK assembles the call from the
//    streamed deltas, parses its arguments, runs the function and appends the tool message;
// 2. the conversation with the result is sent back (tool_choice none) and streamed.
// Prints one JSON line {called, deltas, messages, answer, finish, calls_finish}; exits non-zero
// on any error.
import OpenAI from 'openai';

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120000 });

const parameters = {
  type: 'object',
  properties: {
    city: { type: 'string', enum: ['Paris', 'Tokyo'] },
    unit: { type: 'string', enum: ['c', 'f'] },
  },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const called = [];
function get_weather(args) {
  called.push(args);
  return JSON.stringify({ temperature: 21, unit: args.unit });
}

const deltas = [];
let callsFinish = null;
const runner = client.chat.completions.runTools({
  model, stream: true, max_tokens: 400, temperature: 0, reasoning_effort: 'none',
  messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
  tools: [{
    type: 'function',
    function: { name: 'get_weather', description: 'The current weather of a city.', parameters,
                function: get_weather, parse: JSON.parse },
  }],
  tool_choice: { type: 'function', function: { name: 'get_weather' } },
  parallel_tool_calls: false,
});
runner.on('chunk', (chunk) => {
  const choice = chunk.choices[0];
  if (!choice) return;
  for (const t of choice.delta?.tool_calls ?? []) deltas.push(t);
  if (choice.finish_reason) callsFinish = choice.finish_reason;
});
await runner.done();
const messages = runner.messages;

const stream = await client.chat.completions.create({
  model, messages, stream: true, max_tokens: 8, temperature: 0, reasoning_effort: 'none',
  tools: [{ type: 'function', function: { name: 'get_weather', parameters } }],
  tool_choice: 'none',
});
let answer = '';
let finish = null;
for await (const chunk of stream) {
  const choice = chunk.choices[0];
  if (!choice) continue;
  answer += choice.delta?.content ?? '';
  if (choice.finish_reason) finish = choice.finish_reason;
}
console.log(JSON.stringify({ called, deltas, messages, answer, finish, calls_finish: callsFinish }));
