// The shapes of the API's answers the page reads (see the OpenAPI document at
// `<base_path>/openapi.json`): only the fields used here.

export interface Usage {
  input_tokens?: number;
  output_tokens?: number;
}

export interface RunListed {
  run_id: string;
  session_id: string;
  agent: string;
  status: string;
  parent_run_id?: string | null;
  root_run_id: string;
  depth: number;
  started_at: string;
  updated_at: string;
  iterations: number;
  usage: Usage;
  cost_usd: number;
}

export interface RunPage {
  runs: RunListed[];
  scanned: number;
  truncated: boolean;
}

export interface Agent {
  name: string;
  description: string;
}

export interface WhoAmI {
  tenant: string;
  key?: string;
  open: boolean;
  scopes: string[];
}

export interface PendingApproval {
  call_id: string;
  tool_name: string;
  arguments?: unknown;
  reason?: string;
  run_id: string;
  session_id: string;
  expire_at?: string | null;
}

export interface RunResult {
  run_id: string;
  session_id: string;
  agent: string;
  status: string;
  text?: string;
  error?: string | null;
  error_type?: string | null;
  iterations: number;
  usage: Usage;
  cost_usd: number;
  pending_approvals: PendingApproval[];
  redacted?: string[];
}

export interface SpanEvent {
  name: string;
  time?: string;
  attributes?: Record<string, unknown>;
}

export interface Span {
  span_id: string;
  parent_span_id?: string;
  kind: string;
  name: string;
  run_id: string;
  start_time: string;
  end_time?: string;
  duration_ms?: number;
  status: string;
  attributes: Record<string, unknown>;
  events?: SpanEvent[];
}

export interface Trace {
  run_id: string;
  session_id: string;
  agent: string;
  status: string;
  finished: boolean;
  iterations: number;
  usage: Usage;
  cost_usd: number;
  active_ms: number;
  output?: string;
  error_type?: string;
  content: boolean;
  spans: Span[];
  redacted?: string[];
}

/** The run states, as `GET /v1/runs?status=` takes them. */
export const RUN_STATUSES = [
  "ready_for_model",
  "awaiting_tools",
  "waiting_child",
  "paused",
  "finalizing",
  "completed",
  "failed",
  "cancelled",
];
