Feature: Two-phase plan commit with review and approval
  As an execution engine committing a plan of many sandboxes
  I want every conflict found before any original is touched, and a review bound to the commit
  So that a failed plan never shows half its changes and a reviewed plan is what lands

  Background:
    Given a manager over real directories
    And a plan "p" of 4 copy_on_write sandboxes that each change their original

  Scenario: A plan commits in two phases
    When the plan is committed with mode "two_phase"
    Then every original holds its sandbox's change
    And no staged file is left beside any original
    And the journal records mode "two_phase" and phase "committed"

  Scenario: A conflict in the last sandbox touches no original
    Given the original of sandbox 4 was edited after the sandbox was made
    When the plan is committed with mode "two_phase"
    Then the commit fails with reason "CommitFailed" naming sandbox 4
    And no original was touched
    And no staged file is left beside any original
    And every sandbox of the plan is still "active"

  Scenario: The same conflict under the saga changes and undoes three originals
    Given the original of sandbox 4 was edited after the sandbox was made
    When the plan is committed with mode "saga"
    Then the commit fails having rolled back 3 sandboxes

  Scenario: A review approves the plan and a later edit is refused
    Given the plan was reviewed and its digest approved
    And sandbox 2 is edited after the approval
    When the plan is committed with the approved digest
    Then the commit fails with reason "ChangedSinceApproval" naming no sandbox
    And no original was touched

  Scenario: A plan reviewed and approved commits with its digest
    Given the plan was reviewed and its digest approved
    When the plan is committed with the approved digest
    Then every original holds its sandbox's change

  Scenario: Two participants that cannot prepare durably fall back to the saga in auto mode
    Given the plan also has 2 SQLite sandboxes
    When the plan is committed with mode "auto"
    Then every original holds its sandbox's change
    And every result says it fell back to the saga because of the last resource
