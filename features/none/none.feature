Feature: Pass-through sandbox (strategy "none")
  As a plan author
  I want a "none" sandbox for resources that cannot be sandboxed
  So that writes reach the original immediately, with the risk stated loudly (seed 002, NoSandbox)

  # --- Creation ---

  Scenario: Create a pass-through sandbox
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created for plan "plan-001"
    Then the none sandbox should be in the "created" state
    And the none sandbox context should reference plan "plan-001"
    And the none sandbox context should have strategy metadata "none"
    And the none sandbox path should be the original directory
    And a none warning should have been logged saying "cannot be rolled back"

  Scenario: Creating a pass-through sandbox with empty plan_id raises ValueError
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created with empty plan_id
    Then a none ValueError should be raised with message "plan_id cannot be empty"

  Scenario: Creating a pass-through sandbox with empty resource_id raises ValueError
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is prepared with empty resource_id
    Then a none ValueError should be raised with message "resource_id cannot be empty"

  Scenario: Creating a pass-through sandbox with empty original_path raises ValueError
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is prepared with empty original_path
    Then a none ValueError should be raised with message "original_path cannot be empty"

  # --- Path resolution ---

  Scenario: get_path resolves inside the original
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created for plan "plan-001"
    And the none path "data/file.txt" is resolved
    Then the none resolved path should be "data/file.txt" inside the original directory
    And the none sandbox should be in the "active" state

  Scenario: Path traversal is rejected
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created for plan "plan-001"
    And the none path "../etc/passwd" is resolved
    Then a none ValueError should be raised with message "Path traversal not allowed"

  # --- Writes are immediate ---

  Scenario: A write through the sandbox lands in the original before commit
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created for plan "plan-001"
    And the none file "new.txt" is written through the sandbox with content "immediate"
    Then the none original file "new.txt" should contain "immediate"
    And the none sandbox should be in the "active" state

  Scenario: Commit records acceptance of writes already made
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created for plan "plan-001"
    And the none file "existing.txt" is written through the sandbox with content "updated"
    And the none sandbox is committed with message "accept"
    Then the none commit result should indicate success
    And the none sandbox should be in the "committed" state
    And the none original file "existing.txt" should contain "updated"

  # --- Rollback ---

  Scenario: Rollback from COMMITTED is refused
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created for plan "plan-001"
    And the none file "existing.txt" is written through the sandbox with content "updated"
    And the none sandbox is committed with message "accept"
    And the none sandbox rollback is attempted
    Then a none SandboxStateError should be raised
    And the none sandbox should be in the "committed" state
    And the none original file "existing.txt" should contain "updated"

  Scenario: Rollback of an active pass-through sandbox undoes nothing and says so
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created for plan "plan-001"
    And the none file "existing.txt" is written through the sandbox with content "updated"
    And the none sandbox rollback is attempted
    Then no none error should have been raised
    And the none sandbox should be in the "rolled_back" state
    And the none original file "existing.txt" should contain "updated"
    And a none warning should have been logged saying "are not undone"

  # --- Cleanup ---

  Scenario: Cleanup never removes the original
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created for plan "plan-001"
    And the none file "new.txt" is written through the sandbox with content "kept"
    And the none sandbox is cleaned up
    And the none sandbox is cleaned up
    Then the none sandbox should be in the "cleaned_up" state
    And the none original file "existing.txt" should contain "original content"
    And the none original file "new.txt" should contain "kept"

  Scenario: Commit on a cleaned-up sandbox raises SandboxStateError
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is created for plan "plan-001"
    And the none sandbox is cleaned up
    And the none sandbox commit is attempted
    Then a none SandboxStateError should be raised

  # --- Protocol properties ---

  Scenario: Pass-through sandbox has a unique ULID identifier
    Given a none original directory with file "existing.txt" containing "original content"
    When a none sandbox is instantiated
    Then the none sandbox_id should be a valid ULID
    And the none sandbox status should be "pending"
    And the none sandbox context should be None
    And the none sandbox should not be rollbackable
