-- Run in the buffer of a .est file with one unknown name: waits for the diagnostics of
-- estc lsp and checks them, then quits with status 0, or 1 with a message on failure.
local function fail(msg)
  io.stderr:write("nvim test: " .. msg .. "\n")
  vim.cmd("cquit 1")
end

local buf = vim.api.nvim_get_current_buf()
if vim.bo[buf].filetype ~= "est" then
  fail("filetype is '" .. vim.bo[buf].filetype .. "', not 'est'")
end
if vim.bo[buf].commentstring ~= "// %s" then
  fail("commentstring is '" .. vim.bo[buf].commentstring .. "'")
end
local ok = vim.wait(30000, function()
  return #vim.diagnostic.get(buf) > 0
end, 50)
if not ok then
  fail("no diagnostics from estc lsp within 30 s")
end
local d = vim.diagnostic.get(buf)
if #d ~= 1 then
  fail("expected 1 diagnostic, got " .. #d .. ": " .. vim.inspect(d))
end
-- `code` is a field of its own from Neovim 0.8; 0.7 keeps the LSP's diagnostic aside.
local code = d[1].code or (d[1].user_data and d[1].user_data.lsp and d[1].user_data.lsp.code)
local want = "unknown name `zzz`"
if code ~= "E0201" or d[1].message:sub(1, #want) ~= want or d[1].lnum ~= 2 or d[1].col ~= 14 then
  fail("unexpected diagnostic: " .. vim.inspect(d[1]))
end
if d[1].severity ~= vim.diagnostic.severity.ERROR then
  fail("not an error: " .. vim.inspect(d[1]))
end
io.stdout:write("nvim test: ok (Neovim " .. tostring(vim.version().major) .. "." .. tostring(vim.version().minor) .. ", " .. code .. " at 3:15)\n")
vim.cmd("qall!")
