-- est for Neovim: `.est` files get the filetype `est`, `//` comments, and the language
-- server `estc lsp` (diagnostics as you type, hover, go to definition, symbols,
-- completion). Works on Neovim 0.7 (Debian 12 ships 0.7.2), which has no
-- `vim.lsp.start`, and on 0.8 and later. See docs/editors.md.
--
--   vim.opt.runtimepath:append("/path/to/est/editors/nvim")
--   require("est").setup({ target = "wafer" })   -- or "host"
--
-- Options: `cmd` (default { "estc", "lsp" }), `target` ("wafer", the default, or
-- "host").

local M = {}

local config = { cmd = { "estc", "lsp" }, target = "wafer" }

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
    init_options = { target = config.target },
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

-- Switches the running servers to another target ("host" or "wafer"); they re-check
-- every open document.
function M.set_target(target)
  config.target = target
  local get = vim.lsp.get_clients or vim.lsp.get_active_clients
  for _, c in ipairs(get()) do
    if c.name == "estc" then
      c.notify("workspace/didChangeConfiguration", { settings = { est = { target = target } } })
    end
  end
end

return M
