-- est for Neovim: `.est` files get the filetype `est`, `//` comments, and the language
-- server `estc lsp` (diagnostics as you type, hover, go to definition, symbols,
-- completion, rename, code actions, signature help, formatting) with its inlay hints:
-- each binding's shape. Works on Neovim 0.7 (Debian 12 ships 0.7.2), which has no
-- `vim.lsp.start` and no inlay hints of its own (the hints are then drawn at the end
-- of their lines), and on 0.8 and later (0.10 draws the hints itself). See
-- docs/editors.md.
--
--   vim.opt.runtimepath:append("/path/to/est/editors/nvim")
--   require("est").setup({ target = "wafer" })   -- or "host"
--
-- Options: `cmd` (default { "estc", "lsp" }), `target` ("wafer", the default, or
-- "host"), `mode` (the graph whose shapes the hints show: "train", the default,
-- "eval" or "predict"), `inlay_hints` (default true).

local M = {}

local config = { cmd = { "estc", "lsp" }, target = "wafer", mode = "train", inlay_hints = true }

-- Where hints are drawn on Neovim before 0.10.
local hint_ns = vim.api.nvim_create_namespace("est_inlay_hints")
local builtin_hints = vim.fn.has("nvim-0.10") == 1

-- Asks for the buffer's inlay hints and draws them at the end of their lines
-- (`x: f32[32, 64], n = 3`), for Neovim before 0.10.
local function draw_hints(buf)
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(buf) },
    range = {
      start = { line = 0, character = 0 },
      ["end"] = { line = vim.api.nvim_buf_line_count(buf), character = 0 },
    },
  }
  vim.lsp.buf_request(buf, "textDocument/inlayHint", params, function(err, result)
    if err or type(result) ~= "table" or not vim.api.nvim_buf_is_valid(buf) then
      return
    end
    vim.api.nvim_buf_clear_namespace(buf, hint_ns, 0, -1)
    local lines, order = {}, {}
    for _, h in ipairs(result) do
      local l = h.position.line
      local text = vim.api.nvim_buf_get_lines(buf, l, l + 1, false)[1] or ""
      -- the name the hint follows (its column counts UTF-16 units), and the hint
      -- (`: f32[..]` or ` = 3`)
      local ok, byte = pcall(vim.str_byteindex, text, h.position.character, true)
      local name = text:sub(1, ok and byte or h.position.character):match("[%w_]+$") or ""
      local label = type(h.label) == "string" and h.label or ""
      if lines[l] == nil then
        lines[l] = {}
        table.insert(order, l)
      end
      table.insert(lines[l], name .. label)
    end
    for _, l in ipairs(order) do
      vim.api.nvim_buf_set_extmark(buf, hint_ns, l, 0, {
        virt_text = { { "  " .. table.concat(lines[l], ", "), "Comment" } },
        virt_text_pos = "eol",
      })
    end
  end)
end

-- Shows the hints of a buffer once its client is ready, and after its changes.
local function on_attach(_, buf)
  if not config.inlay_hints then
    return
  end
  if builtin_hints then
    vim.lsp.inlay_hint.enable(true, { bufnr = buf })
    return
  end
  draw_hints(buf)
  vim.api.nvim_create_autocmd({ "InsertLeave", "TextChanged", "BufWritePost" }, {
    group = vim.api.nvim_create_augroup("est_hints_" .. buf, { clear = true }),
    buffer = buf,
    callback = function()
      draw_hints(buf)
    end,
  })
end

-- Client ids by root directory, for Neovim 0.7, where each client is started and
-- attached by hand (0.8's `vim.lsp.start` reuses a client by itself).
local clients = {}

local function start(buf)
  local file = vim.api.nvim_buf_get_name(buf)
  local root = vim.fn.fnamemodify(file, ":p:h")
  local opts = {
    name = "estc",
    cmd = config.cmd,
    root_dir = root,
    init_options = { target = config.target, mode = config.mode },
    on_attach = on_attach,
  }
  if vim.lsp.start then
    vim.lsp.start(opts, { bufnr = buf })
    return
  end
  local id = clients[root]
  if id == nil or vim.lsp.get_client_by_id(id) == nil then
    id = vim.lsp.start_client(opts)
    clients[root] = id
  end
  if id then
    -- (on_attach runs for this buffer once the client is initialised)
    vim.lsp.buf_attach_client(buf, id)
  end
end

function M.setup(opts)
  config = vim.tbl_extend("force", config, opts or {})
  local group = vim.api.nvim_create_augroup("est", { clear = true })
  -- An autocommand rather than `vim.filetype.add`, which 0.7 only uses with
  -- `g:do_filetype_lua` set.
  vim.api.nvim_create_autocmd({ "BufRead", "BufNewFile" }, {
    group = group,
    pattern = "*.est",
    callback = function(args)
      vim.bo[args.buf].filetype = "est"
    end,
  })
  vim.api.nvim_create_autocmd("FileType", {
    group = group,
    pattern = "est",
    callback = function(args)
      vim.bo[args.buf].commentstring = "// %s"
      start(args.buf)
    end,
  })
end

-- Sends the target and mode to the running servers.
local function send_settings()
  local get = vim.lsp.get_clients or vim.lsp.get_active_clients
  for _, c in ipairs(get()) do
    if c.name == "estc" then
      local settings = { settings = { est = { target = config.target, mode = config.mode } } }
      -- (a method from 0.10: 0.11 warns that the field form is going)
      if vim.fn.has("nvim-0.10") == 1 then
        c:notify("workspace/didChangeConfiguration", settings)
      else
        c.notify("workspace/didChangeConfiguration", settings)
      end
    end
  end
end

-- Switches the running servers to another target ("host" or "wafer"); they re-check
-- every open document.
function M.set_target(target)
  config.target = target
  send_settings()
end

-- Switches the inlay hints to another mode's graph ("train", "eval" or "predict").
function M.set_mode(mode)
  config.mode = mode
  send_settings()
  if not builtin_hints and config.inlay_hints then
    for _, buf in ipairs(vim.api.nvim_list_bufs()) do
      if vim.api.nvim_buf_is_loaded(buf) and vim.bo[buf].filetype == "est" then
        draw_hints(buf)
      end
    end
  end
end

return M
